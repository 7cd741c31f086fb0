"""`python -m cairn.coordinator [REDIS_URL] [--name NAME]`: a coordinator until SIGTERM or SIGINT.

The Redis URL comes from `CAIRN_REDIS_URL` unless given (a URL on the command line, and
its password, shows in every process listing: `cairn up` passes it in the environment).
A second coordinator started against the same Redis is a standby: it takes over when the
first one's lease lapses. `cairn coordinator` runs the same loop.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from types import FrameType

from cairn.agents.logs import configure_logging
from cairn.agents.logship import ship_logs
from cairn.agents.tracing import start_tracing, stop_tracing
from cairn.coordinator import metrics
from cairn.coordinator.coordinator import Coordinator
from cairn.coordinator.settings import load_settings, open_store
from cairn.errors import InvalidSpec
from cairn.storage.backends.redis import connect


def main(argv: list[str] | None = None, kind: type[Coordinator] = Coordinator) -> int:
    """Run one coordinator (of class `kind`); return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="default: CAIRN_REDIS_URL")
    parser.add_argument("--name", default=f"{socket.gethostname()}")
    parser.add_argument("--lease-ms", type=int, default=5_000)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(redis_url=args.url)  # CAIRN_*, read once for the process
        url, _origin = settings.redis()
    except InvalidSpec as exc:  # a setting, not the command line: its one line, no usage
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    configure_logging(settings.log_format, settings.log_level)
    client = connect(url)
    ship_logs(client, "coordinator")  # `cairn logs TASK` reads a task's lines from Redis
    metrics.serve_coordinator(client, settings.metrics_port)
    try:
        start_tracing(settings.traces("coordinator"))
    except InvalidSpec as exc:  # an OTEL_* variable Cairn cannot export with
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    store = open_store(settings, client)
    coordinator = kind(
        client,
        store,
        name=args.name,
        lease_ttl_ms=args.lease_ms,
    )
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    coordinator.run(stop)
    stop_tracing()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
