"""The stream engine against a model (stream -> list of values), driven by hypothesis.

Rules: create, append, fetch, flush (upload), trim, retention-free deletes, crash + recover, clean reopen.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.engine.store import DATA_PREFIX, StreamStore
from waiting import WAIT_S

STREAMS_MAX = 6


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="stratalog-engine-"))
        self.mem = MemoryStore()
        self.store = self.open()
        self.model: dict[int, list[bytes]] = {}   # every record ever appended, by stream
        self.starts: dict[int, int] = {}

    def open(self) -> StreamStore:
        # A tiny upload threshold so the uploader runs in the background between rules too.
        return StreamStore.open(self.dir, self.mem, small_store_config(upload_bytes_threshold=64 << 10))

    @precondition(lambda self: len(self.model) < STREAMS_MAX)
    @rule()
    def create(self) -> None:
        s = self.store.create_stream()
        self.model[s.stream_id] = []
        self.starts[s.stream_id] = 0

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, STREAMS_MAX - 1), batch=st.lists(st.binary(max_size=2000), min_size=1, max_size=8),
          wait=st.booleans())
    def append(self, pick: int, batch: list[bytes], wait: bool) -> None:
        stream_id = sorted(self.model)[pick % len(self.model)]
        future = self.store.open_stream(stream_id).append(batch)
        if wait:
            assert future.result(timeout=WAIT_S) == len(self.model[stream_id])
        self.model[stream_id].extend(batch)

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, STREAMS_MAX - 1), at=st.floats(0, 1), max_bytes=st.sampled_from([1, 3000, 1 << 30]))
    def fetch(self, pick: int, at: float, max_bytes: int) -> None:
        stream_id = sorted(self.model)[pick % len(self.model)]
        s = self.store.open_stream(stream_id)
        end = s.end_offset  # only acknowledged records are visible
        start = self.starts[stream_id] + int(at * (end - self.starts[stream_id]))
        got = s.fetch(start, max_bytes=max_bytes)
        assert [r.offset for r in got] == list(range(start, start + len(got)))
        assert [r.value for r in got] == self.model[stream_id][start:start + len(got)]
        if start < end:
            assert got, "a fetch below the end returned nothing"
        if max_bytes == 1 << 30:
            assert start + len(got) == end

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, STREAMS_MAX - 1), fraction=st.floats(0, 1))
    def trim(self, pick: int, fraction: float) -> None:
        stream_id = sorted(self.model)[pick % len(self.model)]
        s = self.store.open_stream(stream_id)
        target = self.starts[stream_id] + int(fraction * (s.end_offset - self.starts[stream_id]))
        s.trim(target)
        self.starts[stream_id] = max(self.starts[stream_id], target)
        self.store.delete_unreferenced()

    @rule()
    def crash_and_recover(self) -> None:
        abandon(self.store)
        self.store = self.open()
        self.check_everything_back()

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        self.store = self.open()
        assert self.store.recovery.batches_replayed == 0, "a clean close leaves nothing in the WAL"
        self.check_everything_back()

    def check_everything_back(self) -> None:
        for stream_id, records in self.model.items():
            s = self.store.open_stream(stream_id)
            assert s.start_offset == self.starts[stream_id]
            assert s.end_offset == len(records), f"stream {stream_id}: end {s.end_offset}, wrote {len(records)}"
            got = s.fetch(s.start_offset, max_bytes=1 << 30)
            assert [r.value for r in got] == records[s.start_offset:]
        known = {o.key for o in self.store.metadata.objects()}
        assert {k for k in self.mem.objects if k.startswith(DATA_PREFIX)} <= known, "orphan objects remain"

    @invariant()
    def memory_is_bounded(self) -> None:
        assert self.store.stats()["log_cache_bytes"] <= small_store_config().log_cache_bytes_max

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestEngineStateful = EngineMachine.TestCase
TestEngineStateful.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
