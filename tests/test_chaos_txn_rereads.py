"""The cluster chaos run's transactional loop says where it read a partition again without a rewind of its
own, and its watcher keeps that, with each failed transaction, as a note beside the figures: what an input
written twice is reported with (stratalog.chaos.cluster_txn_child, cluster_txn_load)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stratalog.chaos.cluster_txn_child import Loop
from stratalog.chaos.cluster_txn_load import LoopWorker


@dataclass
class _Message:
    at: tuple[int, int]

    def partition(self) -> int:
        return self.at[0]

    def offset(self) -> int:
        return self.at[1]


def test_the_loop_says_where_it_went_back_in_a_partition(capsys: pytest.CaptureFixture[str]) -> None:
    loop = Loop("127.0.0.1:1", "in", "out")
    loop._say_rereads([_Message((0, 5)), _Message((1, 9)), _Message((0, 6))])
    loop._say_rereads([_Message((0, 3)), _Message((1, 10)), _Message((0, 4))])
    assert capsys.readouterr().out.splitlines() == ["reread 0 6 3"]
    loop._last_read.clear()   # what _rewind does: the failed transaction's inputs are read again, as meant
    loop._say_rereads([_Message((0, 4))])
    assert capsys.readouterr().out == ""


def test_the_watcher_notes_rereads_and_failed_transactions() -> None:
    worker = LoopWorker("127.0.0.1:1", "in")
    worker.handle(["reread", "2", "40", "31"])
    worker.handle(["failed", "Broker:", "Not", "coordinator"])
    first, second = worker.notes
    assert first.endswith("read partition 2 again from offset 31 (it had read up to 40) without a rewind of its own")
    assert second.endswith("a transaction failed: Broker: Not coordinator")
    assert worker.restarts == 1
