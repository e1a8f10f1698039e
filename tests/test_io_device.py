"""The file device: direct I/O where allowed, buffered + fdatasync where O_DIRECT is refused."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.io import block_io
from stratalog.io import device as device_module
from stratalog.io.device import FileDevice, aligned_buffer
from stratalog.native import native
from stratalog.wal import WriteAheadLog
from walkit import CAPACITY_BYTES, small_config


def refuse_direct(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make O_DIRECT fail as tmpfs does on older kernels; count fdatasync calls."""
    real_open = os.open
    syncs: list[int] = []

    def fake_open(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    def counting_fdatasync(fd: int) -> None:
        syncs.append(fd)
        os.fsync(fd)

    monkeypatch.setattr(device_module.os, "open", fake_open)
    monkeypatch.setattr(device_module.os, "fdatasync", counting_fdatasync)
    return syncs


def test_direct_io_with_dsync_on_a_real_disk(tmp_path: Path) -> None:
    dev = FileDevice.open(tmp_path / "dev", size_bytes=1 << 20, create=True)
    try:
        assert dev.direct and dev.durable_writes
        buf = aligned_buffer(8192)
        buf[:5] = b"hello"
        dev.pwrite(buf, 4096)
        back = aligned_buffer(4096)
        assert dev.pread_into(back, 4096) == 4096
        assert bytes(back[:5]) == b"hello"
    finally:
        dev.close()
    assert (tmp_path / "dev").stat().st_size == 1 << 20


class SpyingNative:
    """stratalog._native with its BlockWriter's arguments noted (its fdatasync runs in C, unseen here)."""

    def __init__(self) -> None:
        self.writers: list[tuple[int, int, bool]] = []

    def BlockWriter(self, fd: int, threads: int, sync_each: bool) -> object:  # noqa: N802 (the type's name)
        self.writers.append((fd, threads, sync_each))
        assert native is not None
        return native.BlockWriter(fd, threads, sync_each)


@pytest.mark.parametrize("engine", ["threads", "compiled"])
def test_refused_o_direct_falls_back_to_buffered_writes_and_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, engine: str
) -> None:
    syncs = refuse_direct(monkeypatch)
    spy = SpyingNative()
    if engine == "compiled" and native is None:
        pytest.fail("the compiled core is not built: make test builds it")
    monkeypatch.setattr(block_io, "native", spy if engine == "compiled" else None)
    path = tmp_path / "wal"
    with caplog.at_level(logging.WARNING, logger="stratalog.io"):
        wal = WriteAheadLog.open(path, capacity_bytes=CAPACITY_BYTES, config=small_config())
        list(wal.recover())
        assert not wal.device.direct and not wal.device.durable_writes
        before = len(syncs)
        res = wal.append(b"buffered but synced")
        res.future.result()
        if engine == "threads":
            assert len(syncs) > before, "acknowledged without fdatasync"
        else:  # the compiled writer syncs after each block: asked to here (tests/test_block_io.py shows it does)
            assert [sync_each for _, _, sync_each in spy.writers] == [True]
        wal.close()
        reopened = WriteAheadLog.open(path, config=small_config())
        assert [r.data for r in reopened.recover()] == [b"buffered but synced"]
        reopened.close()
    warnings = [r for r in caplog.records if "refuses O_DIRECT" in r.getMessage()]
    assert len(warnings) == 1, "the fallback is announced once per file"


def test_open_without_create_or_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileDevice.open(tmp_path / "none")
    with pytest.raises(ValueError, match="size_bytes"):
        FileDevice.open(tmp_path / "none", create=True)
    with pytest.raises(ValueError, match="multiple of 4096"):
        FileDevice.open(tmp_path / "odd", size_bytes=5000, create=True)
    assert not (tmp_path / "odd").exists(), "a failed create leaves no file behind"


def test_a_crash_while_creating_leaves_no_short_file(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    # The child dies (like kill -9: no cleanup) a quarter of the way through filling a new file.
    code = (
        "import os, sys\n"
        "from stratalog.io.device import FileDevice\n"
        "def die(done, total):\n"
        "    if done >= total // 4: os._exit(9)\n"
        f"FileDevice.open({str(path)!r}, size_bytes=32 << 20, create=True, progress=die)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], check=False)
    assert child.returncode == 9
    assert not path.exists(), "a half-filled file sits at the WAL's name"
    assert (tmp_path / "wal.creating").exists()
    dev = FileDevice.open(path, size_bytes=32 << 20, create=True)
    dev.close()
    assert path.stat().st_size == 32 << 20
    assert not (tmp_path / "wal.creating").exists()
