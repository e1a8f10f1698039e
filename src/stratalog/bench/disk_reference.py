"""Plain-disk references taken in the same run as a benchmark, on its own files and directory: random 4 KiB
reads of the files a store wrote, and one large sequential write beside them.

A read phase bound by the disk means little alone: these say what the disk gave the same files, in the
same state of the page cache, a moment later. Like the references in :mod:`stratalog.bench.common`, these
loops call os.pread / os.pwrite / os.fdatasync directly, outside io/, on purpose: a reference must not go
through the code it is a reference for.
"""

from __future__ import annotations

import bisect
import errno
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from stratalog.bench.common import run_threads
from stratalog.io.device import aligned_buffer

#: Size and alignment of each reference read: a page, the smallest read the page cache and the disk do.
READ_BLOCK_BYTES = 4096
#: The random-read reference stops after this long, or after as many reads as the index check made gets,
#: whichever comes first. The count keeps a small run's reference no longer than its index check (a get
#: costs at least one read when it misses the cache); the time keeps a million-queue run's reference short
#: while still holding a thousand reads or more, even on a spinning disk, enough for a steady rate.
READ_S_MAX = 10.0
#: Size of each write of the sequential-write reference: large enough that the per-call cost vanishes.
WRITE_BLOCK_BYTES = 1 << 20
#: What the sequential-write reference writes: as much as the store's WAL holds, several times any disk
#: write cache, and a few seconds on this machine.
WRITE_BYTES = 1 << 30
#: The sequential-write reference's file, in the benchmark's directory; deleted when written.
WRITE_FILE_NAME = "disk-reference-write.tmp"


@dataclass(frozen=True, slots=True)
class RandomReads:
    """What :func:`random_reads` measured."""

    threads: int
    files: int
    file_bytes: int
    reads: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.reads / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {"threads": self.threads, "files": self.files, "file_bytes": self.file_bytes,
                "block_bytes": READ_BLOCK_BYTES, "reads": self.reads, "seconds": self.seconds,
                "per_s": self.per_s, "bytes_per_s": self.per_s * READ_BLOCK_BYTES}


@dataclass(frozen=True, slots=True)
class SequentialWrite:
    """What :func:`sequential_write` measured."""

    written_bytes: int
    seconds: float
    direct: bool

    @property
    def bytes_per_s(self) -> float:
        return self.written_bytes / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {"bytes": self.written_bytes, "block_bytes": WRITE_BLOCK_BYTES, "seconds": self.seconds,
                "mib_per_s": self.bytes_per_s / (1 << 20), "direct": self.direct}


def random_reads(paths: Sequence[Path], threads: int, reads_max: int, seconds_max: float,
                 seed: int) -> RandomReads:
    """``threads`` threads pread 4 KiB blocks at uniformly random block-aligned positions of ``paths`` (a file
    is picked in proportion to its size) through POSIX_FADV_RANDOM descriptors, so the kernel reads no
    more than asked. Buffered, not O_DIRECT: blocks in the page cache count as they would for the store.
    Files gone before they are opened are skipped (a merge may delete one); an opened file stays readable.
    Nothing left to read: no reads, in no time.
    """
    if threads < 1 or reads_max < 1 or seconds_max <= 0:
        raise ValueError("random_reads needs threads >= 1, reads_max >= 1 and seconds_max > 0")
    fds: list[int] = []
    try:
        block_counts: list[int] = []
        file_bytes = 0
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            fds.append(fd)
            size = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            block_counts.append(-(-size // READ_BLOCK_BYTES))
            file_bytes += size
        block_ends = list(accumulate(block_counts))
        if not block_ends or block_ends[-1] == 0:
            return RandomReads(threads, len(fds), file_bytes, 0, 0.0)
        counts = [0] * threads
        started_s = time.perf_counter()
        deadline_s = started_s + seconds_max

        def reader(t: int) -> None:
            rng = random.Random(seed + t)
            blocks = block_ends[-1]
            quota = reads_max // threads + (t < reads_max % threads)
            clock, pread, pick = time.perf_counter, os.pread, bisect.bisect_right
            done = 0
            while done < quota and clock() < deadline_s:
                block = rng.randrange(blocks)
                f = pick(block_ends, block)
                first = block_ends[f - 1] if f else 0
                pread(fds[f], READ_BLOCK_BYTES, (block - first) * READ_BLOCK_BYTES)
                done += 1
            counts[t] = done

        run_threads(threads, reader, "bench-disk-reference")
        seconds = time.perf_counter() - started_s
    finally:
        for fd in fds:
            os.close(fd)
    return RandomReads(threads, len(fds), file_bytes, sum(counts), seconds)


def sequential_write(dir_path: Path, size_bytes: int) -> SequentialWrite:
    """Write ``size_bytes`` (whole 1 MiB blocks, at least one) of random bytes to a new file in ``dir_path``
    with O_DIRECT, fdatasync, and delete the file. Where O_DIRECT is refused (EINVAL: tmpfs, some network
    and FUSE filesystems) the writes are buffered, still with the fdatasync, and ``direct`` says so."""
    blocks = max(1, size_bytes // WRITE_BLOCK_BYTES)
    path = dir_path / WRITE_FILE_NAME
    buf = aligned_buffer(WRITE_BLOCK_BYTES)
    buf.write(os.urandom(WRITE_BLOCK_BYTES))  # not zeros: a disk that compresses must not gain
    try:
        try:
            return _write_blocks(path, buf, blocks, direct=True)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            return _write_blocks(path, buf, blocks, direct=False)
    finally:
        buf.close()
        path.unlink(missing_ok=True)


def _write_blocks(path: Path, buf: Any, blocks: int, *, direct: bool) -> SequentialWrite:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    try:
        started_s = time.perf_counter()
        for i in range(blocks):
            written = os.pwrite(fd, buf, i * WRITE_BLOCK_BYTES)
            if written != WRITE_BLOCK_BYTES:
                raise OSError(errno.EIO, f"short write to {path}: {written} of {WRITE_BLOCK_BYTES} bytes; "
                                         "is the disk full?")
        os.fdatasync(fd)
        seconds = time.perf_counter() - started_s
    finally:
        os.close(fd)
    return SequentialWrite(blocks * WRITE_BLOCK_BYTES, seconds, direct)
