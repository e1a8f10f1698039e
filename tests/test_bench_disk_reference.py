"""The plain-disk references benchmarks take beside their own figures: their bounds, the files they skip,
and the buffered fallback where O_DIRECT is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from stratalog.bench import disk_reference
from stratalog.bench.disk_reference import READ_BLOCK_BYTES, WRITE_BLOCK_BYTES, random_reads, sequential_write


def _file(path: Path, size_bytes: int) -> Path:
    path.write_bytes(os.urandom(size_bytes))
    return path


def test_random_reads_stop_at_the_count_split_over_the_threads(tmp_path: Path) -> None:
    paths = [_file(tmp_path / "a", 10 * READ_BLOCK_BYTES), _file(tmp_path / "b", 3 * READ_BLOCK_BYTES + 100)]
    reads = random_reads(paths, threads=4, reads_max=101, seconds_max=60.0, seed=1)
    assert reads.reads == 101 and reads.threads == 4
    assert reads.files == 2 and reads.file_bytes == 13 * READ_BLOCK_BYTES + 100
    summary = reads.summary()
    assert summary["per_s"] == pytest.approx(101 / reads.seconds)
    assert summary["bytes_per_s"] == pytest.approx(summary["per_s"] * READ_BLOCK_BYTES)


def test_random_reads_stop_at_the_time_bound(tmp_path: Path) -> None:
    paths = [_file(tmp_path / "a", 16 * READ_BLOCK_BYTES)]
    reads = random_reads(paths, threads=2, reads_max=1 << 40, seconds_max=0.05, seed=1)
    assert 0 < reads.reads < 1 << 40 and reads.seconds < 5.0


def test_random_reads_skip_files_gone_before_they_open(tmp_path: Path) -> None:
    """A merge may delete an object between the listing and the reads."""
    paths = [tmp_path / "merged-away", _file(tmp_path / "kept", 4 * READ_BLOCK_BYTES)]
    reads = random_reads(paths, threads=1, reads_max=10, seconds_max=60.0, seed=1)
    assert reads.files == 1 and reads.reads == 10


def test_random_reads_of_nothing_read_nothing(tmp_path: Path) -> None:
    reads = random_reads([tmp_path / "gone", _file(tmp_path / "empty", 0)], threads=2, reads_max=10,
                         seconds_max=60.0, seed=1)
    assert reads.reads == 0 and reads.per_s == 0.0


def test_sequential_write_writes_whole_blocks_and_deletes_its_file(tmp_path: Path) -> None:
    written = sequential_write(tmp_path, 3 * WRITE_BLOCK_BYTES + 1000)
    assert written.written_bytes == 3 * WRITE_BLOCK_BYTES and written.seconds > 0 and written.bytes_per_s > 0
    assert written.summary()["bytes"] == 3 * WRITE_BLOCK_BYTES
    assert list(tmp_path.iterdir()) == []


def test_sequential_write_falls_back_to_buffered_where_direct_io_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()  # open now with O_DIRECT (a closed descriptor's number comes back)
    refused = [0]

    def open_(path: Any, flags: int, *args: Any) -> int:
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        else:
            direct_fds.discard(fd)
        return fd

    def pwrite(fd: int, data: Any, position: int) -> int:
        if fd in direct_fds:  # as some filesystems do: the open succeeds, the first write fails
            refused[0] += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(disk_reference.os, "open", open_)
    monkeypatch.setattr(disk_reference.os, "pwrite", pwrite)
    written = sequential_write(tmp_path, 2 * WRITE_BLOCK_BYTES)
    assert refused == [1] and not written.direct and written.summary()["direct"] is False
    assert written.written_bytes == 2 * WRITE_BLOCK_BYTES
    assert list(tmp_path.iterdir()) == []
