"""Transfers of one S3 object in concurrent parts, under pyarrow's stream interface.

For Ray Train, an s3:// location becomes a `pyarrow.fs.PyFileSystem` around `S3Handler`,
which moves the bytes of one file in concurrent parts: a parallel multipart upload when Ray
persists a checkpoint, concurrent ranged GETs when `Checkpoint.as_directory` downloads one.
Ray's own loops call pyarrow's `copy_files` on it unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
from collections import deque
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs

from podium.storage.backends.s3_client import MiB, s3_call, s3_call_async, s3_settings, s3_submit, split_object_path


class MultipartWriter(io.RawIOBase):
    """Write one S3 object; parts are uploaded concurrently (up to `concurrency`) while the caller writes.

    A file smaller than one part is a single PUT. The object appears only when
    `close` completes the upload; a writer dropped without `close` (an error
    while copying) aborts it, so a partial object is never visible. A part is
    whatever was written once `part_size` bytes are pending (pyarrow writes in
    64 MiB chunks: one chunk, one part, no copy); the threshold doubles every
    2000 parts to stay under S3's 10,000-part limit.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, part_size: int, concurrency: int):
        super().__init__()
        self._fs, self._path = fs, path
        self._bucket, self._key = split_object_path(fs, path)
        self._part_size, self._concurrency = part_size, concurrency
        self._pending: list[Any] = []
        self._pending_bytes = 0
        self._written = 0
        self._upload_id: str | None = None
        self._parts: list[concurrent.futures.Future] = []

    def writable(self) -> bool:
        """Always: this is a write stream."""
        return True

    def tell(self) -> int:
        """Bytes written so far."""
        return self._written

    def write(self, data: Any) -> int:
        """Keep `data`; once a part's worth is pending, upload it in the background."""
        if self.closed:
            raise ValueError("write to a closed MultipartWriter")
        n = memoryview(data).nbytes
        self._pending.append(data if isinstance(data, bytes) else bytes(data))  # bytes are immutable: no copy
        self._pending_bytes += n
        self._written += n
        if self._pending_bytes >= self._part_size << (len(self._parts) // 2000):
            self._start_part(self._take_pending())
        return n

    def _take_pending(self) -> bytes:
        body = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return body

    def _start_part(self, body: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = s3_call(self._fs, "create_multipart_upload", Bucket=self._bucket,
                                           Key=self._key)["UploadId"]
        pending = [f for f in self._parts if not f.done()]
        if len(pending) >= self._concurrency:
            concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for f in self._parts:  # a failed part stops the upload now, not at close
            if f.done() and (failed := f.exception()) is not None:
                raise failed
        self._parts.append(s3_submit(self._fs, s3_call_async(
            self._fs, "upload_part", Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
            PartNumber=len(self._parts) + 1, Body=body)))

    def close(self) -> None:
        """Upload what is left and complete the object (or abort the upload on any error)."""
        if self.closed:
            return
        try:
            if self._upload_id is None:
                s3_call(self._fs, "put_object", Bucket=self._bucket, Key=self._key, Body=self._take_pending())
            else:
                if self._pending:
                    self._start_part(self._take_pending())
                parts = [{"PartNumber": i, "ETag": f.result()["ETag"]} for i, f in enumerate(self._parts, 1)]
                s3_call(self._fs, "complete_multipart_upload", Bucket=self._bucket, Key=self._key,
                                 UploadId=self._upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort()
            raise
        finally:
            self._pending = []
            super().close()
            self._fs.invalidate_cache(self._path)

    def _abort(self) -> None:
        for f in self._parts:
            f.cancel()
        if self._upload_id is not None:
            try:
                s3_call(self._fs, "abort_multipart_upload", Bucket=self._bucket, Key=self._key,
                                 UploadId=self._upload_id)
            except Exception:  # best effort: the store's lifecycle rules reap what is left
                pass
            self._upload_id = None

    def __del__(self) -> None:
        if not self.closed:  # never complete an upload nobody closed: that would publish a partial file
            self._abort()
            self._pending = []
            super().close()


async def get_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, etag: str | None,
                    attempts: int = 3) -> bytes:
    """Bytes [start, end) of one S3 object, on s3fs's event loop; with `etag`, only of that version (If-Match).

    A body cut off mid-read is fetched again (up to `attempts` times in all): botocore retries
    the request, not the streaming of its body."""
    bucket, key = split_object_path(fs, path)
    kw = {"IfMatch": etag} if etag else {}
    for attempt in range(1, attempts + 1):
        resp = await s3_call_async(fs, "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **kw)
        try:
            data = await resp["Body"].read()
        except (OSError, asyncio.TimeoutError):
            if attempt == attempts:
                raise
            continue
        finally:
            resp["Body"].close()
        if len(data) == end - start:
            return data
    raise OSError(f"s3://{path}: short read of bytes {start}-{end - 1}")


class RangeReader(io.RawIOBase):
    """Read one S3 object front to back; the next ranges are fetched concurrently while the caller reads.

    Every range asks for the ETag seen when the reader opened (If-Match), so a
    file replaced while it is read fails instead of mixing two versions. A read
    that takes a whole range gets the downloaded bytes as they are (no copy).
    """

    ATTEMPTS = 3

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, etag: str | None,
                 part_size: int, concurrency: int):
        super().__init__()
        self._fs, self._path, self._size, self._etag = fs, path, size, etag
        self._ranges = deque((start, min(start + part_size, size)) for start in range(0, size, part_size))
        self._concurrency = concurrency
        self._inflight: deque[concurrent.futures.Future] = deque()
        self._chunk = b""
        self._offset = 0  # into _chunk
        self._pos = 0

    def readable(self) -> bool:
        """Always: this is a read stream."""
        return True

    def tell(self) -> int:
        """Bytes read so far."""
        return self._pos

    def size(self) -> int:
        """The object's size."""
        return self._size

    async def _get(self, start: int, end: int) -> bytes:
        return await get_range(self._fs, self._path, start, end, self._etag, self.ATTEMPTS)

    def _fill(self) -> None:
        while self._ranges and len(self._inflight) < self._concurrency:
            self._inflight.append(s3_submit(self._fs, self._get(*self._ranges.popleft())))

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that is left if negative); b'' at the end."""
        want = self._size - self._pos if size is None or size < 0 else min(size, self._size - self._pos)
        out = []
        while want > 0:
            if self._offset == len(self._chunk):
                self._fill()
                self._chunk, self._offset = self._inflight.popleft().result(), 0
                self._fill()
            take = min(want, len(self._chunk) - self._offset)
            whole = self._offset == 0 and take == len(self._chunk)
            out.append(self._chunk if whole else self._chunk[self._offset:self._offset + take])
            self._offset += take
            want -= take
            self._pos += take
        return out[0] if len(out) == 1 else b"".join(out)

    def readall(self) -> bytes:
        """Everything that is left."""
        return self.read(-1)

    def close(self) -> None:
        """Stop fetching ahead."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        self._chunk, self._offset = b"", 0
        super().close()


def open_range_reader(fs: fsspec.AbstractFileSystem, path: str, size: int | None = None,
                      etag: str | None = None) -> RangeReader:
    """A concurrent front-to-back reader of an S3 object (raises FileNotFoundError if there is none).

    Pass `size` and `etag` from a listing to spare a HEAD request.
    """
    s = s3_settings()
    if size is None:
        info = fs.info(path)
        if info.get("type") != "file":
            raise FileNotFoundError(f"s3://{path} is not a file")
        size, etag = int(info.get("size") or 0), info.get("ETag")
    return RangeReader(fs, path, size, etag, s.part_size_mb * MiB, s.concurrency)


class S3Handler(pafs.FSSpecHandler):
    """pyarrow's fsspec handler with concurrent part transfers for streams (what `copy_files` uses).

    Ray Train persists and downloads checkpoints with `pyarrow.fs.copy_files`,
    which reads input streams and writes output streams in 64 MiB chunks: here
    those chunks become concurrent multipart uploads and ranged GETs. Random
    access (`open_input_file`, used by Parquet readers) stays with s3fs, without its read-ahead.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, part_size: int = 64 * MiB, concurrency: int = 4):
        super().__init__(fs)
        self.part_size, self.concurrency = part_size, concurrency
        self._listed: dict[str, tuple[int, str | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_listed": {}}  # what one process listed means nothing to another

    def create_dir(self, path: str, recursive: bool) -> None:
        """Nothing to do: S3 has no folders. (s3fs's mkdir would create a missing bucket; podium never does.)"""

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        """One LIST request per path answers file, folder or nothing (s3fs would HEAD, then LIST for a folder)."""
        return [self._info(path) for path in paths]

    def _remember(self, path: str, size: int, etag: str | None) -> None:
        if len(self._listed) > 10_000:  # listed but never opened (a Parquet scan): forget, it is only a shortcut
            self._listed.clear()
        self._listed[path.strip("/")] = (size, etag)

    def _info(self, path: str) -> pafs.FileInfo:
        bucket, key = split_object_path(self.fs, path)
        key = key.rstrip("/")
        if not key:
            return super().get_file_info([path])[0]
        try:
            page = s3_call(self.fs, "list_objects_v2", Bucket=bucket, Prefix=key, Delimiter="/", MaxKeys=1000)
        except PermissionError:  # may read objects but not list them: ask the way s3fs does
            return super().get_file_info([path])[0]
        except FileNotFoundError:  # no such bucket
            return pafs.FileInfo(path, pafs.FileType.NotFound)
        for obj in page.get("Contents", []):
            if obj["Key"] == key:
                self._remember(f"{bucket}/{key}", int(obj["Size"]), obj.get("ETag"))
                return pafs.FileInfo(path, pafs.FileType.File, size=int(obj["Size"]), mtime=obj.get("LastModified"))
        if any(p["Prefix"] == f"{key}/" for p in page.get("CommonPrefixes", [])):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        if page.get("IsTruncated"):  # more siblings sharing the name's prefix than one page holds
            return super().get_file_info([path])[0]
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """One listing of the tree; the sizes and ETags it gives spare the HEAD of each stream opened next."""
        base = selector.base_dir.strip("/")
        found = self.fs.find(base, maxdepth=None if selector.recursive else 1, withdirs=True, detail=True)
        entries = {path: info for path, info in found.items() if path.strip("/") != base}
        if not entries:  # an empty folder, a file, or nothing: pyarrow tells these apart
            kind = self.get_file_info([base])[0].type
            if kind == pafs.FileType.File:
                raise NotADirectoryError(base)
            if kind == pafs.FileType.NotFound and not selector.allow_not_found:
                raise FileNotFoundError(base)
            return []
        for path, info in entries.items():
            if info.get("type") == "file":
                self._remember(path, int(info.get("size") or 0), info.get("ETag"))
        return [self._create_file_info(path, info) for path, info in entries.items()]

    def open_input_file(self, path: str) -> pa.NativeFile:
        """Random access (Parquet readers): each read fetches the range asked for. pyarrow already merges
        a row group's column chunks into large reads; s3fs's default 50 MB read-ahead fetched whole
        files to read a footer's neighbourhood, one column or one sampled row group."""
        if not self.fs.isfile(path):
            raise FileNotFoundError(path)
        return pa.PythonFile(self.fs.open(path, mode="rb", cache_type="none"), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        """A prefetching sequential reader (If-Match pins it to the listed ETag, so a stale listing fails safe)."""
        known = self._listed.pop(path.strip("/"), None)
        if known is None:
            info = self.fs.info(path)
            if info.get("type") != "file":
                raise FileNotFoundError(path)
            known = (int(info.get("size") or 0), info.get("ETag"))
        reader = RangeReader(self.fs, path, known[0], known[1], self.part_size, self.concurrency)
        return pa.PythonFile(reader, mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        """A parallel multipart writer."""
        return pa.PythonFile(MultipartWriter(self.fs, path, self.part_size, self.concurrency), mode="w")
