"""Timestamp of Ray Train's own validation results, for variant (c).

Ray Train (2.60) merges a finished validation's metrics into its checkpoint
manager on the controller (`CheckpointManager.update_checkpoints_with_validation_result`);
no public callback sees that moment. `install` is a Ray `worker_process_setup_hook`:
in every worker process of the benchmark job it arranges that, if and when that
module is imported (only the Train controller does), the method is wrapped to append
one line per checkpoint to $BENCH_RECORD_LOG. It imports nothing heavy itself, so
worker start-up (and so validation latency) is not slowed down. Benchmark-only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

ENV = "BENCH_RECORD_LOG"
TARGET = "ray.train.v2._internal.execution.checkpoint.checkpoint_manager"


def _append(path: str, record: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _patch(module, path: str) -> None:
    manager = module.CheckpointManager
    original = manager.update_checkpoints_with_validation_result
    if getattr(original, "_bench_wrapped", False):
        return

    def wrapped(self, checkpoint_updates):
        result = original(self, checkpoint_updates)
        now = time.time()
        for checkpoint, (metrics, status) in checkpoint_updates.items():
            _append(path, {"kind": "recorded", "checkpoint": os.path.basename(checkpoint.path.rstrip("/")),
                           "path": checkpoint.path, "t": now, "status": str(status),
                           "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}})
        return result

    wrapped._bench_wrapped = True
    manager.update_checkpoints_with_validation_result = wrapped


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, path: str):
        self.path = path

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, log = spec.loader, self.path

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                _patch(module, log)

        spec.loader = _Loader()
        return spec


def install() -> None:
    """Ray worker_process_setup_hook: wrap the method now if imported, else when it is imported."""
    path = os.environ.get(ENV)
    if not path:
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET], path)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(path))
