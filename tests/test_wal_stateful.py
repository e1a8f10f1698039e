"""The WAL against a model (a dict of offset -> data), driven by hypothesis.

Rules: append, wait for durability, trim, crash + recover (a power cut image), close + reopen.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from stratalog.errors import OverCapacityError
from stratalog.io.faulty import MemDevice
from stratalog.wal import RecoveredRecord, WriteAheadLog
from waiting import WAIT_S
from walkit import acknowledged, new_wal, small_config


class WALMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.wal, self.device = new_wal()
        self.model: dict[int, bytes] = {}   # what the log holds above the trim, acknowledged or not
        self.durable: set[int] = set()      # offsets that must survive any crash
        self.session: list = []             # (offset, data, future) appended since the last open
        self.trim_offset = -1

    # Rules ------------------------------------------------------------------------------------------

    @rule(data=st.binary(max_size=3000))
    def append(self, data: bytes) -> None:
        try:
            res = self.wal.append(data)
        except OverCapacityError:
            self.wait_all()
            self.trim(1.0)
            res = self.wal.append(data)
        self.session.append((res.offset, data, res.future))
        self.model[res.offset] = data

    @rule()
    def wait_all(self) -> None:
        if self.session:
            self.session[-1][2].result(timeout=WAIT_S)
        self.durable.update(acknowledged(self.session))

    @rule(fraction=st.floats(0.0, 1.0))
    def trim(self, fraction: float) -> None:
        candidates = sorted(o for o in self.durable if o > self.trim_offset)
        if not candidates:
            return
        target = candidates[min(int(fraction * len(candidates)), len(candidates) - 1)]
        self.wal.trim(target)
        self.trim_offset = target
        self.model = {o: d for o, d in self.model.items() if o > target}
        self.durable = {o for o in self.durable if o > target}

    @rule(seed=st.integers(0, 2**32 - 1))
    def crash_and_recover(self, seed: int) -> None:
        must = self.durable | set(acknowledged(self.session))
        image = self.device.crash_image(random.Random(seed))
        self.wal.close()
        self.device = MemDevice(len(image), image=image)
        self.wal = WriteAheadLog.open(self.device, config=small_config())
        records = list(self.wal.recover())
        self.check_recovered(records, must)
        # What recovery returned is the log now: durable (recovery syncs) and must survive.
        self.model = {r.offset: r.data for r in records}
        self.durable = set(self.model)
        self.session = []

    @rule()
    def close_and_reopen(self) -> None:
        self.wal.close()
        self.wal = WriteAheadLog.open(self.device, config=small_config())
        records = list(self.wal.recover())
        assert [(r.offset, r.data) for r in records] == sorted(self.model.items())
        self.durable = set(self.model)
        self.session = []

    # Checks -----------------------------------------------------------------------------------------

    def check_recovered(self, records: list[RecoveredRecord], must: set[int]) -> None:
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)), "recovery returned records out of order or twice"
        for rec in records:
            assert rec.offset > self.trim_offset, f"record {rec.offset} at or below trim {self.trim_offset}"
            assert self.model.get(rec.offset) == rec.data, f"record {rec.offset} is not what was written"
        lost = {o for o in must if o > self.trim_offset} - set(offsets)
        assert not lost, f"acknowledged records lost: {sorted(lost)}"

    @invariant()
    def offsets_above_trim(self) -> None:
        assert all(o > self.trim_offset for o in self.model)

    def teardown(self) -> None:
        self.wal.close()


TestWALStateful = WALMachine.TestCase
TestWALStateful.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
