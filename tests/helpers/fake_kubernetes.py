"""A fake Kubernetes API on loopback for one RayJob: each GET of it answers the next status of a sequence (the
last one repeats); None in the sequence answers 404, as the API does once a RayJob is deleted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def rayjob(status: dict[str, Any] | None, deadline_s: int = 3600, backoff_limit: int = 1) -> dict[str, Any] | None:
    """A RayJob resource with this status (None: none, the RayJob is gone)."""
    if status is None:
        return None
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "podium-nightly", "namespace": "podium"},
            "spec": {"activeDeadlineSeconds": deadline_s, "backoffLimit": backoff_limit}, "status": status}


@contextmanager
def fake_kubernetes_api(namespace: str, name: str, sequence: list[dict[str, Any] | None]) -> Iterator[str]:
    """The fake API's URL while the block runs; it serves `sequence` (RayJob resources, None for a 404) at the
    RayJob's path, one per GET."""
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
    served = iter(sequence)
    last: list[dict[str, Any] | None] = [None]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != path:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            last[0] = next(served, last[0])
            if last[0] is None:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            else:
                self._answer(200, last[0])

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
