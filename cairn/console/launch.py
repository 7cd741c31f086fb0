"""`cairn console`: decide where the console may listen, then serve it until interrupted.

A loopback address (the default, 127.0.0.1) needs no token; any other address refuses to
start without `CAIRN_CONSOLE_TOKEN`, before anything listens or Redis is asked.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from cairn.client import Client
from cairn.coordinator.settings import Settings
from cairn.errors import InvalidSpec

EXTRA = "pip install 'cairn-agents[console]'"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """True when `host` (a name or an address) can only be reached from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_hosts(host: str, port: int) -> frozenset[str]:
    """The `Host` headers a console listening on loopback `host`:`port` answers."""
    bound = f"[{host}]" if ":" in host else host
    return frozenset(f"{name}:{port}" for name in {*LOOPBACK_NAMES, bound})


def check_bind(host: str, token: str | None) -> None:
    """Raise `InvalidSpec` when `host` is not a loopback address and no token is set."""
    if token is None and not is_loopback(host):
        raise InvalidSpec(
            f"console: {host} is not a loopback address: set CAIRN_CONSOLE_TOKEN "
            "to serve it there, or bind 127.0.0.1"
        )


def run_console(
    settings: Settings,
    host: str | None,
    port: int | None,
    open_client: Callable[[], Client],
    say: Callable[[str], None],
) -> int:
    """Serve the console on `host`:`port` (default: the settings') until interrupted; 0.

    Raises `InvalidSpec` for a non-loopback address without a token and for a missing
    `console` extra, `Unavailable` when Redis does not answer, `OSError` when the
    address cannot be listened on.
    """
    host = host or settings.console_host
    port = port or settings.console_port
    token = settings.console_token.get_secret_value() if settings.console_token else None
    check_bind(host, token)
    try:
        import uvicorn  # noqa: PLC0415 - the `console` extra, imported when it is used

        from cairn.console.app import build_app  # noqa: PLC0415 - imports starlette
        from cairn.console.security import Guard  # noqa: PLC0415 - imports starlette
    except ImportError as exc:
        raise InvalidSpec(f"the console needs the console extra: {EXTRA} ({exc})") from None
    client = open_client()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family)
    bound_port = listener.getsockname()[1]
    hosts = loopback_hosts(host, bound_port) if is_loopback(host) else None
    app = build_app(client, Guard(token=token or None, hosts=hosts))
    config = uvicorn.Config(app, log_config=None, access_log=False, log_level="warning")
    shown = f"[{host}]" if ":" in host else host
    with_token = "/?token=<CAIRN_CONSOLE_TOKEN>" if token else "/"
    say(f"Cairn console on http://{shown}:{bound_port}{with_token} (Ctrl-C stops it)")
    uvicorn.Server(config).run(sockets=[listener])
    return 0
