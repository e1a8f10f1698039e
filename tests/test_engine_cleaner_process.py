"""The cleaner's computing part in a process of its own (engine/cleaner_process.py): the same objects as in
the store's own thread, errors raised in the child reach the pass as they are, and a child that dies fails
its pass (nothing changed) while the next pass starts another."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from enginekit import MemoryStore
from stratalog.engine.batch import CorruptBatchError
from stratalog.engine.cleaner_process import ProcessWork, WorkerGoneError
from stratalog.engine.cleaner_work import CleanWork, PassSettings
from stratalog.engine.config import CleanerBounds
from stratalog.engine.objformat import BlockEntry
from stratalog.engine.store import DATA_PREFIX
from test_engine_cleaner import EAGER, NOW_MS, everything, open_store, produce, rounds


def cleaned_objects(path: Path, *, own_process: bool) -> tuple[dict[str, bytes], list[tuple[int, bytes | None, bytes]]]:
    """A stream of overwrites and tombstones in three blocks, cleaned twice: the data objects and records."""
    mem = MemoryStore()
    bounds = CleanerBounds(rewrite_bytes_max=1, read_bytes_per_s_max=None, own_process=own_process)
    with open_store(path, mem, cleaner=bounds, stream_object_bytes_min=1) as store:
        s = store.create_stream("s")
        for part in range(3):
            produce(s, [*rounds(7, 3), (b"k3", None), (f"x{part}".encode(), b"once")], per_batch=4)
            store.flush()
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        produce(s, rounds(5, 2))
        store.flush()
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        records = everything(s)
    return {k: bytes(v) for k, v in mem.objects.items() if k.startswith(DATA_PREFIX)}, records


def test_the_process_writes_the_objects_the_thread_writes(tmp_path: Path) -> None:
    in_process, records = cleaned_objects(tmp_path / "process", own_process=True)
    in_thread, records_in_thread = cleaned_objects(tmp_path / "thread", own_process=False)
    assert records == records_in_thread
    assert in_process == in_thread
    assert [k for _, k, _ in records].count(b"k0") == 1, "compacted: one record per key"


def test_an_error_in_the_child_is_raised_in_the_pass_as_it_was() -> None:
    work = ProcessWork()
    try:
        work.begin(PassSettings(1, 0, 0))
        garbage = b"\x07" * 64   # a batch header claiming 117 MB
        entry = BlockEntry(1, 0, 10, 0, len(garbage), 10, 0, 0)
        with pytest.raises(CorruptBatchError) as in_child:
            work.map_block(garbage, entry)
        with pytest.raises(CorruptBatchError) as in_thread:
            CleanWork().map_block(garbage, entry)
        assert str(in_child.value) == str(in_thread.value)
        assert work.map_block(b"", BlockEntry(1, 0, 0, 0, 0, 0, 0, 0)) == (0, 0), "the child serves on"
    finally:
        work.close()


def test_a_child_killed_mid_pass_fails_the_pass_and_the_next_starts_another(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem, stream_object_bytes_min=1) as store:
        s = store.create_stream("s")
        produce(s, rounds(6, 4))
        store.flush()
        before = everything(s)
        work = store._cleaner._work
        assert isinstance(work, ProcessWork)
        rewrite_block = work.rewrite_block

        def killed_first(*args: object) -> int:
            assert work._process is not None
            os.kill(work._process.pid, signal.SIGKILL)
            return rewrite_block(*args)  # type: ignore[arg-type]

        work.rewrite_block = killed_first  # type: ignore[method-assign]
        with pytest.raises(WorkerGoneError, match="exit code -9"):
            store.clean_stream(s, EAGER, now_ms=NOW_MS)
        assert everything(s) == before, "nothing committed"
        work.rewrite_block = rewrite_block  # type: ignore[method-assign]
        assert store.clean_stream(s, EAGER, now_ms=NOW_MS).objects_written == 1
        assert [o for o, _, _ in everything(s)] == list(range(18, 24))
        process = work._process
    assert process is not None and process.poll() is not None, "the store's close ended its cleaner process"
