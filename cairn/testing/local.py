"""`LocalCairn`: what `cairn up` runs, in a directory of a test's own.

A private `redis-server` (on a free port, with a password made for it), one coordinator
and a number of worker processes, all started from the directory given and all stopped
at the end of the `with` block. The workers are `cairn.testing.worker`s, which a script's
`crash` kills; a process that dies is started again, as `cairn up` does. Its `client`
is a `cairn.Client` on that Redis.
"""

from __future__ import annotations

import secrets
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.client import Client
from cairn.coordinator.settings import Settings, load_settings
from cairn.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from cairn.cli.processes import Supervisor

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL: a test's steps are short


class LocalCairn:
    """A private Redis, a coordinator and `workers` worker processes under `directory`.

    `settings` are Cairn's settings as `load_settings` takes them (`sandbox="off"`,
    `tools=("mypackage.tools",)`, ...); the state, archive and log directories default to
    `directory`. The processes' logs are in `directory / "logs"`.
    """

    def __init__(self, directory: Path, *, workers: int = 1, **settings: object) -> None:
        if workers < 1:
            raise ValueError("a task needs at least one worker")
        self.directory = Path(directory).resolve()
        self.workers = workers
        self.settings: Settings = load_settings(state_dir=self.directory, **settings)
        self.server = RedisServer(self.directory / "redis", password=secrets.token_hex(16))
        self._supervisor: Supervisor | None = None
        self._watching: threading.Thread | None = None
        self._stop = threading.Event()
        self._client: Client | None = None

    @property
    def url(self) -> str:
        """The private Redis's URL (it holds the password)."""
        return self.server.url

    @property
    def client(self) -> Client:
        """A `Client` on the private Redis (started by `start`)."""
        if self._client is None:
            raise RuntimeError("LocalCairn is not started: use it in a `with` block")
        return self._client

    def start(self) -> LocalCairn:
        """Start Redis, then the coordinator and the workers; return once Redis answers."""
        # Imported here: the CLI imports this package's RedisServer, so a module-level
        # import of the CLI would be circular.
        from cairn.cli.processes import Child, Supervisor, worker_children  # noqa: PLC0415

        self.server.start()
        try:
            logs = self.directory / "logs"
            coordinator = Child(
                "coordinator",
                [sys.executable, "-m", "cairn.coordinator", "--name", "local"],
                self.settings.child_env(self.url),
                logs / "coordinator.log",
            )
            # The testing worker: a script's `crash` kills it (`cairn.testing.faults`).
            workers = worker_children(self.settings, self.url, self.workers, logs,
                                      module="cairn.testing.worker")  # fmt: skip
            self._supervisor = Supervisor([coordinator, *workers])
            self._supervisor.start()
            self._stop.clear()
            self._watching = threading.Thread(
                target=self._supervisor.watch, args=(self._stop,), name="LocalCairn", daemon=True
            )
            self._watching.start()
            self._client = Client(self.url, settings=self.settings)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the workers and the coordinator (SIGTERM, then SIGKILL), then Redis."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._stop.set()
        if self._watching is not None:
            self._watching.join()
            self._watching = None
        if self._supervisor is not None:
            self._supervisor.stop(grace=STOP_GRACE)
            self._supervisor = None
        self.server.stop()

    def __enter__(self) -> LocalCairn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
