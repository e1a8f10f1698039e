"""A store's data directory, as both stores (streams and queues) open it: made if missing, locked for one
process, and its object store opened.

The lock is an ``flock`` on the file ``LOCK`` in the directory: two processes writing one WAL would each
trim what the other still needs, so a second open fails at once with StoreLockedError instead. The kernel
drops the lock when the process dies, so a crash never leaves a directory locked.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING

from stratalog.errors import StratalogError

if TYPE_CHECKING:
    from stratalog.objects.store import ObjectStore

#: The lock file's name inside a data directory.
LOCK_FILE_NAME = "LOCK"


class StoreLockedError(StratalogError):
    """Another process has this data directory open."""


def prepare_data_dir(data_dir: str | os.PathLike[str],
                     object_store: str | ObjectStore | None) -> tuple[Path, ObjectStore]:
    """Create ``data_dir`` if needed and open its object store: ``None`` (a local directory under it), a
    URI, or an ObjectStore as it is."""
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    if object_store is None or isinstance(object_store, str):
        from stratalog.objects.uri import open_object_store

        return path, open_object_store(object_store, path)
    return path, object_store


def lock_data_dir(data_dir: Path) -> int:
    """Hold ``data_dir``'s lock file for this process (one store per directory) and return its descriptor,
    which :func:`unlock_data_dir` closes; StoreLockedError if another process holds it."""
    fd = os.open(data_dir / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        os.close(fd)
        raise StoreLockedError(f"{data_dir} is open in another process; close it there first") from e
    return fd


def unlock_data_dir(fd: int) -> None:
    """Let go of a lock :func:`lock_data_dir` took (closing the descriptor drops the flock)."""
    os.close(fd)
