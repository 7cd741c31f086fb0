"""The web console (`cairn console`): every task live, approvals, restores and forks in a browser.

`launch.run_console` checks where it may listen and serves `app.build_app` with uvicorn;
the server needs the `console` extra (Starlette, uvicorn), imported only when it starts.
The console reads and changes tasks through `cairn.Client` alone. docs/console.md.
"""
