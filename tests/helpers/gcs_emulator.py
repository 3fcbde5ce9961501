"""gcp-storage-emulator (PyPI) on loopback, as a process: `python gcs_emulator.py PORT BUCKET [--preconditions]`.

The emulator ignores GCS's generation preconditions: an upload with `ifGenerationMatch=0` overwrites an
existing object, one with a stale generation succeeds. Served as it is, it is a store whose conditional
writes do not hold (what podium must refuse to build a lease on). With `--preconditions`, its object
handlers first check `ifGenerationMatch` as GCS documents it (0: no live object; otherwise the live
object's generation; 412 when it does not hold), under one lock so that check and write are one step.
"""

from __future__ import annotations

import sys
import threading
import time
from http import HTTPStatus


def honour_preconditions() -> None:
    """Wrap the emulator's object handlers (before its server module binds them) with GCS's ifGenerationMatch."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    lock = threading.RLock()  # `get` of alt=media calls `download`, checked too

    def checked(handler):
        def run(request, response, storage, *args, **kwargs):
            wanted = request.query.get("ifGenerationMatch")
            with lock:
                if wanted:
                    bucket = request.params["bucket_name"]
                    name = request.params.get("object_id") or request.query.get("name", [""])[0]
                    try:
                        live = str(storage.get_file_obj(bucket, name)["generation"])
                    except NotFound:
                        live = "0"
                    if live != wanted[0]:
                        response.status = HTTPStatus.PRECONDITION_FAILED
                        response.json({"error": {"code": 412, "message": "conditionNotMet"}})
                        return None
                return handler(request, response, storage, *args, **kwargs)
        return run

    for name in ("insert", "get", "download", "delete"):
        setattr(objects, name, checked(getattr(objects, name)))


def main() -> None:
    port, bucket = int(sys.argv[1]), sys.argv[2]
    if "--preconditions" in sys.argv[3:]:
        honour_preconditions()
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
