"""A filesystem of your own (userfs://): storage in a pyarrow filesystem that a function of yours builds.

Ray Train's persistent-storage guide passes `RunConfig(storage_filesystem=<pyarrow.fs.FileSystem>,
storage_path=...)`: an S3FileSystem with an endpoint of its own, an fsspec filesystem wrapped in
`PyFileSystem(FSSpecHandler(...))`. A `[storage]` table `{ path, filesystem, filesystem_kwargs }` does that
for podium; the configuration keeps it as the location `userfs://<filesystem>[;<kwargs>]/<path>`
(podium.config), so what travels to other processes and into records is the function's import path, never the
filesystem. Each process calls the function once for each set of kwargs, Ray's workers included.

- Ray Train gets the filesystem itself as its storage_filesystem (Ray pickles it to its workers, as the
  guide requires of any storage_filesystem).
- podium's own reads and writes (checkpoint listings, validations, fingerprints, promotion's copy to the
  serving location) go through fsspec's ArrowFSWrapper around the same filesystem.
- Whole-object writes go to a temporary file first, moved into place: readers see the old content or the
  new (a rename where the filesystem has one; on an object store a copy, then a delete).
- No conditional writes: create-only writes are plain writes (the last writer wins), and there is no lease on
  a location here. A run's lock on its name logs that there is none, as on any store without conditional writes
  (podium.storage.lease): start one `podium run` of a name at a time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import posixpath
import uuid
from typing import Any, ClassVar

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper

from podium.config import USERFS_SCHEME, parse_userfs_location
from podium.imports import ImportPathError, resolve_callable
from podium.storage.backends.base import Backend
from podium.storage.errors import StorageError

FIELD = "storage.filesystem"


class UserFilesystemBackend(Backend):
    """userfs:// locations (see the module docstring)."""

    name: ClassVar[str] = "userfs"
    schemes: ClassVar[tuple[str, ...]] = (USERFS_SCHEME,)

    def normalize(self, uri: str) -> str:
        """userfs://package.module:function[;kwargs]/path, as podium.config writes it."""
        try:
            parse_userfs_location(uri)
        except ValueError as exc:
            raise StorageError(uri, str(exc)) from None
        return uri.rstrip("/")

    def import_paths(self, location: str) -> tuple[str, ...]:
        """The filesystem function the location names (none where the location is malformed: the storage check
        says so)."""
        try:
            return (parse_userfs_location(location)[0],)
        except ValueError:
            return ()

    def arrow_filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """Your function's filesystem (built once per process) and the path inside it."""
        factory, kwargs, path = parse_userfs_location(location)
        return build_filesystem(factory, json.dumps(kwargs, sort_keys=True))[0], path

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """The same filesystem through fsspec's ArrowFSWrapper."""
        factory, kwargs, path = parse_userfs_location(location)
        return build_filesystem(factory, json.dumps(kwargs, sort_keys=True))[1], path

    def make_folder(self, location: str) -> None:
        """The folder, where the filesystem has folders (pyarrow's create_dir; on an object store, nothing or a
        marker)."""
        fs, path = self.arrow_filesystem(location)
        fs.create_dir(path, recursive=True)

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """A complete temporary file beside `path`, moved over it."""
        staged = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}")
        fs.pipe_file(staged, data)
        try:
            fs.mv(staged, path)
        except BaseException:
            with contextlib.suppress(Exception):  # the move's own error says what went wrong
                fs.rm_file(staged)
            raise


@functools.cache
def build_filesystem(factory: str, kwargs_json: str) -> tuple[pafs.FileSystem, fsspec.AbstractFileSystem]:
    """Call the function at `factory` with the kwargs (JSON), once per process: its filesystem, and the same
    through fsspec. StorageError naming storage.filesystem unless it returns a pyarrow.fs.FileSystem."""
    kwargs: dict[str, Any] = json.loads(kwargs_json)
    try:
        make = resolve_callable(factory, FIELD)
    except ImportPathError as exc:
        raise StorageError(factory, str(exc)) from None
    try:
        fs = make(**kwargs)
    except Exception as exc:
        raise StorageError(factory, f"{FIELD} = {factory!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(fs, pafs.FileSystem):
        raise StorageError(factory, f"{FIELD} = {factory!r} returned {_described(fs)}: expected a "
                                    "pyarrow.fs.FileSystem (e.g. pyarrow.fs.SubTreeFileSystem, pyarrow.fs.S3FileSystem, "
                                    "or an fsspec filesystem in pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)))")
    return fs, _Wrapper(fs, skip_instance_cache=True)


def _described(value: Any) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    return "None" if value is None else f"a {kind}"


class _Wrapper(ArrowFSWrapper):
    """ArrowFSWrapper that creates a file's folder before writing it, as object stores need no folders and
    podium's other stores make them on demand (a local filesystem refuses a file in a missing folder)."""

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, seekable: bool = True,
              **kwargs: Any) -> Any:
        if mode != "rb":
            parent = self._parent(path)
            if parent and self.fs.get_file_info(parent).type == pafs.FileType.NotFound:
                self.fs.create_dir(parent, recursive=True)
        return super()._open(path, mode, block_size, seekable, **kwargs)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        parent = self._parent(path2)
        if parent and self.fs.get_file_info(parent).type == pafs.FileType.NotFound:
            self.fs.create_dir(parent, recursive=True)
        super().mv(path1, path2, **kwargs)

