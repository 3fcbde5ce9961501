"""Filesystem functions named by import path (`storage.filesystem`) in the unit tests."""

import pyarrow.fs as pafs


def subtree(root: str) -> pafs.FileSystem:
    """A folder of this machine as a filesystem of its own: paths inside it are relative to `root`."""
    return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())


def not_a_filesystem() -> str:
    """What a user might return by mistake: a path."""
    return "/mnt/storage"


def unreachable() -> pafs.FileSystem:
    """A filesystem function that fails."""
    raise ConnectionError("no endpoint at http://127.0.0.1:9")
