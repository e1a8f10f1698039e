"""The block-device protocol and its file / raw-device implementation.

Only this package calls ``os.pwrite`` / ``os.pread`` / ``fdatasync`` on data files; everything above goes
through :class:`Device`, so tests can swap in the fault-injecting :class:`~stratalog.io.faulty.MemDevice`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import stat
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("stratalog.io")

#: Alignment direct I/O needs for buffers, positions and lengths (page size, 4 KiB sectors).
DIRECT_ALIGN_BYTES = 4096
#: Size of each write when a new file is filled with zeros (so later O_DSYNC writes need no extent updates).
PREFILL_CHUNK_BYTES = 4 << 20

_warned_buffered: set[str] = set()


class Device(Protocol):
    """A fixed-size array of bytes with positioned I/O and a durability barrier."""

    @property
    def size_bytes(self) -> int: ...

    @property
    def direct(self) -> bool:
        """True when I/O bypasses the page cache: buffers, positions and lengths must be 4 KiB aligned."""
        ...

    @property
    def durable_writes(self) -> bool:
        """True when every pwrite is on stable storage once it returns (O_DSYNC); no sync needed."""
        ...

    def pwrite(self, buf: bytes | bytearray | memoryview | mmap.mmap, position_bytes: int) -> None:
        """Write all of ``buf`` at ``position_bytes`` or raise OSError."""
        ...

    def pread_into(self, buf: memoryview | mmap.mmap, position_bytes: int) -> int:
        """Fill ``buf`` from ``position_bytes``; return the bytes read (short only at the device end)."""
        ...

    def sync(self) -> None:
        """Make every completed write durable (fdatasync), or raise OSError."""
        ...

    def close(self) -> None: ...


def aligned_buffer(size_bytes: int) -> mmap.mmap:
    """A zeroed, page-aligned buffer for direct I/O (anonymous mmap is page-aligned)."""
    return mmap.mmap(-1, size_bytes)


class FileDevice:
    """A preallocated regular file or a raw block device, with O_DIRECT where the filesystem allows it.

    ``sync_writes`` opens the file O_DSYNC so each write is durable when it returns. Where O_DIRECT is
    refused (tmpfs) the device falls back to buffered I/O, says so once in the log, and leaves
    durability to :meth:`sync` (fdatasync).
    """

    def __init__(self, fd: int, path: str, size_bytes: int, direct: bool, durable_writes: bool) -> None:
        self._fd = fd
        self.path = path
        self._size_bytes = size_bytes
        self._direct = direct
        self._durable_writes = durable_writes

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def direct(self) -> bool:
        return self._direct

    @property
    def durable_writes(self) -> bool:
        return self._durable_writes

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        size_bytes: int | None = None,
        create: bool = False,
        sync_writes: bool = True,
        direct: bool = True,
        progress: Callable[[int, int], None] | None = None,
        read_only: bool = False,
    ) -> FileDevice:
        """Open (and with ``create``, preallocate to ``size_bytes``) a file or block device.

        A regular file that does not exist is created only when ``create`` is true; it is filled with
        zeros so later writes touch no filesystem metadata. ``progress(done_bytes, total_bytes)`` is
        called while filling.
        """
        path = os.fspath(path)
        exists = os.path.exists(path)
        if not exists and not create:
            raise FileNotFoundError(errno.ENOENT, "no WAL file here (pass create=True to make one)", path)
        if not exists:
            if size_bytes is None:
                raise ValueError("size_bytes is needed to create a new WAL file")
            _create_filled(path, size_bytes, direct, progress)
        mode = os.O_RDONLY if read_only else os.O_RDWR
        fd, is_direct = _open_direct(path, mode | os.O_CLOEXEC, direct)
        try:
            st = os.fstat(fd)
            if stat.S_ISBLK(st.st_mode):
                actual = os.lseek(fd, 0, os.SEEK_END)
            elif stat.S_ISREG(st.st_mode):
                actual = st.st_size
            else:
                raise ValueError(f"{path}: not a regular file or block device")
            if sync_writes and is_direct and not read_only:
                # Reopen with O_DSYNC: each direct write is then durable on return, and a failed write
                # is reported to the thread that issued it, with no page cache to hide it (fsyncgate).
                dsync_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_DIRECT | os.O_DSYNC)
                os.close(fd)
                fd = dsync_fd
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path, actual, is_direct, sync_writes and is_direct and not read_only)

    def fileno(self) -> int:
        """The open file's descriptor: the compiled block writer writes through it (io/block_io.py)."""
        return self._fd

    def pwrite(self, buf: bytes | bytearray | memoryview | mmap.mmap, position_bytes: int) -> None:
        view = memoryview(buf)
        done = 0
        total = view.nbytes
        while done < total:
            n = os.pwrite(self._fd, view[done:], position_bytes + done)
            if n <= 0:
                raise OSError(errno.EIO, f"short write at {position_bytes + done} on {self.path}")
            done += n

    def pread_into(self, buf: memoryview | mmap.mmap, position_bytes: int) -> int:
        view = memoryview(buf)
        done = 0
        total = view.nbytes
        while done < total:
            n = os.preadv(self._fd, [view[done:]], position_bytes + done)
            if n == 0:
                break
            done += n
        return done

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _open_direct(path: str, flags: int, want_direct: bool, quiet: bool = False) -> tuple[int, bool]:
    if want_direct:
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # O_CREAT may have made the file before O_DIRECT was refused.
            flags &= ~os.O_EXCL
            if not quiet and path not in _warned_buffered:
                _warned_buffered.add(path)
                log.warning("%s: the filesystem refuses O_DIRECT; using buffered writes + fdatasync", path)
    return os.open(path, flags, 0o644), False


def _create_filled(path: str, size_bytes: int, direct: bool,
                   progress: Callable[[int, int], None] | None) -> None:
    """Make ``path`` a zero-filled file of ``size_bytes``, all or nothing.

    The zeros go to a temporary name first and are renamed into place once synced, so a crash while
    filling leaves no short file at ``path`` (only a ``.creating`` file that the next create replaces).
    """
    if size_bytes % DIRECT_ALIGN_BYTES:
        raise ValueError(f"size_bytes must be a multiple of {DIRECT_ALIGN_BYTES}, got {size_bytes}")
    temp = path + ".creating"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    fd, _ = _open_direct(temp, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL, direct, quiet=True)
    try:
        _prefill(fd, size_bytes, progress)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    os.rename(temp, path)
    _fsync_dir(path)


def _prefill(fd: int, size_bytes: int, progress: Callable[[int, int], None] | None) -> None:
    chunk = aligned_buffer(min(PREFILL_CHUNK_BYTES, size_bytes))
    view = memoryview(chunk)
    done = 0
    while done < size_bytes:
        n = min(len(chunk), size_bytes - done)
        os.pwrite(fd, view[:n], done)
        done += n
        if progress is not None:
            progress(done, size_bytes)
    view.release()
    chunk.close()


def _fsync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
