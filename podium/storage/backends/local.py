"""Local paths (and file:// URIs): pyarrow's own filesystem, folders made on demand, whole-file writes by rename
and create-only ones by hard link. The lock on a local location is an flock (podium.storage.lease), not a lease object."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import ClassVar

import fsspec
import pyarrow.fs as pafs

from podium.storage.backends.base import Backend


class LocalBackend(Backend):
    """A local disk (or a network one mounted as a path)."""

    name: ClassVar[str] = "local"
    schemes: ClassVar[tuple[str, ...]] = ("", "file")
    on_this_disk: ClassVar[bool] = True

    def normalize(self, uri: str) -> str:
        """An absolute path (a file:// URI becomes its path)."""
        if uri.startswith("file://"):
            uri = uri[len("file://"):]
        return os.path.abspath(os.path.expanduser(uri))

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """fsspec's local filesystem and the absolute path."""
        return fsspec.filesystem("file"), location

    def arrow_filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """pyarrow's native local filesystem."""
        return pafs.LocalFileSystem(), location

    def make_folder(self, location: str) -> None:
        """The folder and its parents."""
        os.makedirs(location, exist_ok=True)

    def file_in_the_way(self, location: str) -> str | None:
        """The path, or its nearest parent that exists, where that is no folder."""
        path = location
        while not os.path.lexists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        return None if os.path.isdir(path) else path

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """A complete temporary file, renamed over the old one."""
        _place(path, data, os.replace)

    def create(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """A complete temporary file, hard-linked into place: created whole or not at all, never over another."""
        _place(path, data, os.link)


def on_this_machine(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether an fsspec filesystem is this machine's disk (its files have a real path, size and modification
    time that a later command can trust)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols


def _place(path: str, data: bytes, put: Callable[[str, str], None]) -> None:
    """Write `data` to a temporary file beside `path`, synced, then `put(temporary, path)` it into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        put(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
