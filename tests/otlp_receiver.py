"""A real OTLP/HTTP traces receiver for tests: `python -m tests.otlp_receiver PORT FILE`.

It serves `POST /v1/traces` on 127.0.0.1:PORT as the OpenTelemetry Collector's OTLP/HTTP
receiver does (binary protobuf, gzip or not), decodes each `ExportTraceServiceRequest`
with the official `opentelemetry-proto` types, and appends each span to FILE as one JSON
line: ids in hex, attributes and event attributes as plain values, the resource's
`service.name`. Read them back with `read_spans`.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"


def plain(value: AnyValue) -> Any:
    """An OTLP attribute value as a plain Python value."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return None if kind is None else getattr(value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP key-values (a repeated `KeyValue` field) as a dict."""
    return {pair.key: plain(pair.value) for pair in pairs}


def as_dict(span: Any, service: str | None) -> dict[str, Any]:
    """One OTLP span as a JSON-ready dict, `service` its resource's `service.name`."""
    return {
        "service": service,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "name": span.name,
        "kind": span.kind,
        "start": span.start_time_unix_nano,
        "end": span.end_time_unix_nano,
        "attributes": attributes(span.attributes),
        "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
        "links": [{"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex()} for k in span.links],
        "status": {"code": span.status.code, "message": span.status.message},
    }


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The spans of one export request, as JSON-ready dicts."""
    found = []
    for resource in request.resource_spans:
        service = attributes(resource.resource.attributes).get("service.name")
        spans = [span for scope in resource.scope_spans for span in scope.spans]
        found += [as_dict(span, service) for span in spans]
    return found


class Receiver(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP trace exports and appends their spans to the server's file."""

    server: TraceServer

    def do_POST(self) -> None:
        """Decode an export, append its spans, answer as a collector does."""
        if self.path != PATH:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = "".join(json.dumps(span) + "\n" for span in spans_of(request))
        with self.server.lock, self.server.out.open("a") as sink:
            sink.write(lines)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing per request."""


class TraceServer(ThreadingHTTPServer):
    """The receiver's server: where spans go, and the lock its threads share."""

    def __init__(self, port: int, out: Path) -> None:
        super().__init__(("127.0.0.1", port), Receiver)
        self.out, self.lock = out, threading.Lock()


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans the receiver wrote to `path` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    """Serve until killed."""
    port, out = int(argv[0]), Path(argv[1])
    out.touch()
    TraceServer(port, out).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
