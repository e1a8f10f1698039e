"""QueueStore against a model (queue name -> list of messages, (group, queue) -> offset), driven by
hypothesis: put, put_many, flush, get, commit, committed, and a clean reopen."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from queuekit import small_queue_config
from stratalog.queues import QueueStore

NAMES = st.sampled_from(["a", "b", "queue-c", "é", "d" * 40])
MESSAGES = st.binary(min_size=0, max_size=300)
GROUPS = st.sampled_from(["g1", "g2"])


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="stratalog-queues-"))
        self.store = self.open()
        self.model: dict[str, list[bytes]] = {}
        self.commits: dict[tuple[str, str], int] = {}

    def open(self) -> QueueStore:
        # Tiny thresholds so uploads run in the background between rules and reads cross objects.
        return QueueStore.open(self.dir, config=small_queue_config(upload_bytes_threshold=2048, upload_idle_s=0.001,
                                                                   read_cache_bytes_max=4096))

    @rule(name=NAMES, message=MESSAGES)
    def put(self, name: str, message: bytes) -> None:
        self.store.put(name, message)
        self.model.setdefault(name, []).append(message)

    @rule(batch=st.lists(st.tuples(NAMES, MESSAGES), max_size=40))
    def put_many(self, batch: list[tuple[str, bytes]]) -> None:
        self.store.put_many([n for n, _ in batch], [m for _, m in batch])
        for name, message in batch:
            self.model.setdefault(name, []).append(message)

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @rule(name=NAMES, offset=st.integers(0, 60), num=st.integers(0, 30))
    def get(self, name: str, offset: int, num: int) -> None:
        assert self.store.get(name, offset, num) == self.model.get(name, [])[offset:offset + num]

    @rule(group=GROUPS, name=NAMES, offset=st.integers(0, 100))
    def commit(self, group: str, name: str, offset: int) -> None:
        self.store.commit(group, name, offset)
        self.commits[(group, name)] = offset

    @rule(group=GROUPS, name=NAMES)
    def committed(self, group: str, name: str) -> None:
        assert self.store.committed(group, name) == self.commits.get((group, name))

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self.open()

    @invariant()
    def lengths(self) -> None:
        for name, messages in self.model.items():
            assert len(self.store.get(name, 0, 1000)) == len(messages)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


QueueMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestQueueMachine = QueueMachine.TestCase
