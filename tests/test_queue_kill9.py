"""The queue store under kill -9: a child puts rounds to every queue and flushes after each; the test
SIGKILLs it at a random moment, reopens the store and checks every queue: what was flushed is there,
dense, in order, without duplicates, and what came before the round is unchanged. Each iteration
continues on the store the previous one left.
"""

from __future__ import annotations

import random
from pathlib import Path

from stratalog.chaos.child import start_child
from stratalog.chaos.lines import complete_lines
from stratalog.chaos.queue_child import TAG_FLUSHED, TAG_OPENED, message, queue_name, small_config
from stratalog.queues import QueueConfig, QueueStore

ITERATIONS = 8
QUEUES = 1500
#: Kill 20 to 400 ms after the child opened the store: a few rounds in, mid-put, mid-flush or mid-upload.
KILL_AFTER_S = (0.02, 0.4)
#: ... and every fourth child later, once it has had time for merges: a merge worker takes a few hundred
#: ms to start, so the short children alone left a store with no merged object in one CI run of many.
LONG_KILL_AFTER_S = (1.0, 2.0)


def _flushed_rounds(output: bytes) -> int:
    """How many rounds the child said were durable (-1 + 1 = 0 when none)."""
    rounds = [line.values[0] for line in complete_lines(output) if line.tag == TAG_FLUSHED]
    return max(rounds) + 1 if rounds else 0


def test_every_flushed_message_survives_kill9_dense_and_in_order(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    rng = random.Random(20261122)
    kept: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    flushed_total = 0
    replays = 0
    merged = 0
    for iteration in range(ITERATIONS):
        args = [str(data_dir), "--iteration", str(iteration), "--queues", str(QUEUES)]
        with start_child("stratalog.chaos.queue_child", args, name="queue", beside=data_dir,
                         awaited_tags=[TAG_OPENED]) as child:
            assert child.wait_for(TAG_OPENED, 60), child.failure("never opened the store")
            child.kill_after(rng.uniform(*(LONG_KILL_AFTER_S if iteration % 4 == 3 else KILL_AFTER_S)))
            assert child.killed, child.failure("exited before the kill")
            flushed = _flushed_rounds(child.output)
        flushed_total += flushed
        config = small_config()
        assert isinstance(config, QueueConfig)
        with QueueStore.open(data_dir, config=config) as store:
            replays += store.recovery.records_replayed > 0
            merged += store.recovery.merged_objects > 0
            for q in range(QUEUES):
                got = store.get(queue_name(q), 0, 1 << 20)
                before = kept[q]
                assert got[:len(before)] == before, f"queue {q}: earlier messages changed"
                new = got[len(before):]
                # Rounds 0 .. n-1 of this iteration, each once, in order; at least the flushed ones.
                assert new == [message(iteration, q, r) for r in range(len(new))], f"queue {q}: not dense"
                assert len(new) >= flushed, f"queue {q}: {len(new)} rounds survived, {flushed} were flushed"
                kept[q] = got
    # The checks mean something only if the children got flushes done before most kills.
    assert flushed_total >= 10 * ITERATIONS, flushed_total
    assert replays > 0, "some kills should leave a WAL tail to replay"
    assert merged > 0, "some kills should come after merges of objects"
