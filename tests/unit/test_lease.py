"""location_lock on a local path: an flock whose holder is named to whoever has to wait (S3 leases: test_s3.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from podium.storage.lease import LeaseError, location_lock


def test_local_lock_names_its_holder_and_is_freed_when_the_holder_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from podium.storage.lease import location_lock
        with location_lock({str(tmp_path)!r}, ".run.lock", 5, "run"):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseError, match=rf"^run: .*\.run\.lock is held by pid {holder.pid} on "):
            with location_lock(str(tmp_path), ".run.lock", 0.3, "run"):
                pass
    finally:
        holder.kill()  # SIGKILL: the kernel drops its flock
        holder.wait()
    with location_lock(str(tmp_path), ".run.lock", 5, "run") as check:
        check()
