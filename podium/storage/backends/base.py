"""What a store must offer podium: the `Backend` every scheme's module implements.

A backend answers, for the locations of its URI schemes:

- the filesystems: fsspec (podium's file operations) and pyarrow (Ray Train, Parquet readers);
- the checks on a location: its URI (`normalize`), and whether it is usable (`check_location`; a writable one
  gets its folder first, `make_folder`);
- the streams: a front-to-back reader and a writer published only when closed (`open_read`, `open_write`);
- a copy inside the store, where it has one (`copy_in_store`), and how far the store vouches for it;
- whole-object writes that readers see whole or not at all (`write`: how CURRENT is switched), create-only
  writes (`create`), and the conditional writes a lease is built from (`read_versioned`,
  `create_versioned`, `replace_versioned`, `delete_versioned`), where `conditional_writes` is true;
- what a process started elsewhere (a Ray worker) needs in its environment to reach the store.

The defaults here are plain fsspec: right for any store fsspec reaches, with no lease and no copy in the
store. A backend overrides what its store does better or guarantees more.
"""

from __future__ import annotations

import io
import os
import uuid
from typing import Any, ClassVar

import fsspec
import pyarrow.fs as pafs

from podium.errors import PodiumError
from podium.storage.errors import StorageError

# the lease's TTL where the backend has no setting of its own (S3 keeps PODIUM_S3_LEASE_TTL_S)
LEASE_TTL_ENV = "PODIUM_LEASE_TTL_S"
DEFAULT_LEASE_TTL_S = 30.0

# a file object read or written front to back: fsspec's buffered files, podium's S3 part streams
BinaryStream = io.RawIOBase | io.BufferedIOBase


class Conflict(PodiumError):
    """A conditional write whose condition did not hold: another writer's came first."""


class Backend:
    """A store, for the URI schemes in `schemes` (see the module docstring for what each method answers)."""

    name: ClassVar[str] = "fsspec"
    schemes: ClassVar[tuple[str, ...]] = ()
    # True where `create_versioned` / `replace_versioned` / `delete_versioned` hold their conditions atomically
    conditional_writes: ClassVar[bool] = False
    # environment variables that say where the store is (never credentials), for processes started elsewhere
    setting_env: ClassVar[tuple[str, ...]] = ()
    # True for this machine's disk: a location is a path, files are read into reused buffers, a copy is read back
    # as it is written, and a folder is made before a file is written into it (podium.serving.staging)
    on_this_disk: ClassVar[bool] = False

    # ------------------------------------------------------------------ locations

    def normalize(self, uri: str) -> str:
        """The location as podium keeps it (no trailing slash); StorageError for a URI this store refuses."""
        return uri.rstrip("/")

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """An fsspec filesystem and the path inside it."""
        return fsspec.core.url_to_fs(location)

    def arrow_filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the path inside it (what Ray Train persists checkpoints through)."""
        fs, path = self.fsspec_filesystem(location)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path

    def make_folder(self, location: str) -> None:
        """Create the location's folder where the store has folders (object stores have none): a location that
        must be writable is made first."""

    def import_paths(self, location: str) -> tuple[str, ...]:
        """The user's code a location names ('package.module:function'), which a run's plan imports before anything
        starts; none for a store of podium's own."""
        return ()

    def file_in_the_way(self, location: str) -> str | None:
        """Where a file stands at the location or above it, so that no folder can be there (a store without
        folders has none: None)."""
        return None

    def check_location(self, location: str, *, write: bool) -> None:
        """Prove `location` usable (see podium.storage.preflight.check_location)."""
        fs, path = self.fsspec_filesystem(location)
        if not write:
            if not fs.exists(path):
                raise FileNotFoundError(f"{location}: no such file or directory")
            return
        probe = f"{path.rstrip('/')}/.podium-write-probe-{uuid.uuid4().hex}"
        try:
            self.make_folder(location)
            fs.pipe_file(probe, b"ok")
            fs.rm_file(probe)
        except Exception as exc:
            raise StorageError(location, f"not writable ({type(exc).__name__}: {exc})") from None

    def environment(self) -> dict[str, str]:
        """The `setting_env` variables set in this process."""
        return {name: os.environ[name] for name in self.setting_env if os.environ.get(name)}

    # ------------------------------------------------------------------ bytes

    def open_read(self, fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None) -> BinaryStream:
        """A front-to-back reader (`listed`: the size and etag a listing gave, to spare a request)."""
        return fs.open(path, "rb")

    def open_write(self, fs: fsspec.AbstractFileSystem, path: str) -> BinaryStream:
        """A writer whose file appears only when it is closed without error."""
        return fs.open(path, "wb")

    def read_range(self, fs: fsspec.AbstractFileSystem, path: str, start: int, end: int,
                   listed: dict[str, Any]) -> bytes:
        """Bytes [start, end) of the file a listing gave as `listed` (a store that can pins them to that version)."""
        return fs.cat_file(path, start=start, end=end)

    def copy_in_store(self, fs: fsspec.AbstractFileSystem, src: str, dst: str, size: int,
                      etag: str | None) -> str | None:
        """Copy one object inside the store. Returns the sha256 (hex) the store computed of the copy, if it did.

        Only called where `copies_in_store(source_fs, dest_fs)`."""
        raise NotImplementedError(f"{self.name}: no copy inside the store")

    def copies_in_store(self, source: fsspec.AbstractFileSystem, dest: fsspec.AbstractFileSystem) -> bool:
        """Whether files go from `source` to `dest` by `copy_in_store`, no byte through this process."""
        return False

    def same_copy(self, listed_etag: str | None, size: int, copied: dict[str, Any]) -> bool:
        """Whether the store vouches that `copied` (its info) holds the listed source's bytes."""
        return False

    # ------------------------------------------------------------------ whole-object writes

    def write(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """Replace `path` so that readers see the old content or the new, never a part (an object store's PUT)."""
        fs.pipe_file(path, data)

    def create(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """Write `path` only if it does not exist (FileExistsError if it does). Without conditional
        writes, a plain write: the last writer wins."""
        fs.pipe_file(path, data)

    def read_versioned(self, fs: fsspec.AbstractFileSystem, path: str) -> tuple[bytes, str] | None:
        """An object's bytes and the version token its conditional writes take, or None if there is none."""
        raise NotImplementedError(f"{self.name}: no conditional writes")

    def create_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> str:
        """Create the object if there is none (Conflict otherwise); returns its version token."""
        raise NotImplementedError(f"{self.name}: no conditional writes")

    def replace_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes, token: str) -> str:
        """Replace the object if it is still at version `token` (Conflict otherwise, FileNotFoundError if
        gone); returns the new token."""
        raise NotImplementedError(f"{self.name}: no conditional writes")

    def delete_versioned(self, fs: fsspec.AbstractFileSystem, path: str, token: str) -> None:
        """Delete the object if it is still at version `token` (Conflict otherwise)."""
        raise NotImplementedError(f"{self.name}: no conditional writes")

    def lease_ttl_s(self) -> float:
        """How long a lease holder may go without renewing before another process takes the lease over."""
        raw = os.environ.get(LEASE_TTL_ENV)
        if not raw:
            return DEFAULT_LEASE_TTL_S
        try:
            ttl = float(raw)
        except ValueError:
            ttl = -1.0
        if not 0 < ttl <= 3600:
            raise StorageError("storage settings", f"{LEASE_TTL_ENV} = {raw!r}: expected seconds, "
                                                   "a number above 0 and at most 3600")
        return ttl
