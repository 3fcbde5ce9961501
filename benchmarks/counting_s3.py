"""An S3 server on loopback (moto, as in the tests) that writes down every byte it serves.

    python -m benchmarks.counting_s3 --port 9000 --log reads.jsonl

Each GET that returns object bytes appends one JSON line: time, path (/bucket/key), status, bytes
sent, and the Range asked for. This is how `data_scale.py` measures bytes read from storage,
whichever process read them (training workers, Ray Data's read tasks, validation, the preflight).
Benchmark-only.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any


class CountingApp:
    """A WSGI wrapper: passes requests through, counts the response bytes of object GETs."""

    def __init__(self, app: Any, log_path: str):
        self.app, self.log_path = app, log_path
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        status: list[str] = []

        def recording_start_response(s: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(s)
            return start_response(s, headers, exc_info)

        body = self.app(environ, recording_start_response)
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("QUERY_STRING"):  # listings carry a query
            return body
        return self._counted(body, environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE"), status)

    def _counted(self, body: Iterable[bytes], path: str, range_: str | None, status: list[str]) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close:
                close()
            line = json.dumps({"t": time.time(), "path": path, "status": status[0].split()[0] if status else "",
                               "bytes": sent, "range": range_})
            with self.lock, open(self.log_path, "a") as f:
                f.write(line + "\n")


def main() -> None:
    """Serve moto with byte counting until killed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    for k in [k for k in os.environ if k.startswith("AWS_")]:  # moto's own process needs none of them
        del os.environ[k]
    app = CountingApp(DomainDispatcherApplication(create_backend_app), a.log)
    make_server("127.0.0.1", a.port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()


if __name__ == "__main__":
    main()
