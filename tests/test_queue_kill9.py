"""The queue store under kill -9: a child puts rounds to every queue and flushes after each; the test
SIGKILLs it at a moment it picks from what the child has done (a number of rounds flushed, or a merge
committed), reopens the store and checks every queue: what was flushed is there, dense, in order,
without duplicates, and what came before the round is unchanged. Each iteration continues on the store
the previous one left.

The kills follow events, not the clock: on a loaded machine a child killed a fixed time after it opened
the store may not have flushed or merged anything yet, and the test would prove nothing.
"""

from __future__ import annotations

import random
from pathlib import Path

from stratalog.chaos.child import start_child
from stratalog.chaos.lines import complete_lines
from stratalog.chaos.queue_child import TAG_FLUSHED, TAG_OPENED, message, queue_name, small_config
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStoreError
from stratalog.queues import QueueConfig, QueueStore
from stratalog.queues.manifest import read_queue_manifest
from waiting import wait_until

ITERATIONS = 8
QUEUES = 1500
#: A child is killed once it has flushed this many rounds (drawn anew each time) ...
ROUNDS_BEFORE_KILL = (1, 6)
#: ... and then this long after: mid-put, mid-flush or mid-upload.
KILL_DELAY_S = (0.0, 0.15)
#: Every fourth child is killed only once a merge has been committed (it names a merged object in the
#: queue manifest), then after up to this long, so kills land during and after merges too.
AFTER_MERGE_DELAY_S = (0.0, 0.5)
#: The longest a child may take to flush its rounds or commit a merge on a loaded machine.
CHILD_PROGRESS_S = 180.0


def _merge_committed(data_dir: Path) -> bool:
    """Whether the store's queue manifest (republished at every change of objects) names a merged object."""
    objects = LocalDirStore(data_dir / "objects")
    try:
        return any("-" in ref.key for ref in read_queue_manifest(objects).objects)
    except ObjectStoreError:      # not published yet
        return False
    finally:
        objects.close()


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
            if iteration % 4 == 3:
                wait_until(lambda: _merge_committed(data_dir), "the child to commit a merge", CHILD_PROGRESS_S)
                child.kill_after(rng.uniform(*AFTER_MERGE_DELAY_S))
            else:
                target = rng.randint(*ROUNDS_BEFORE_KILL)
                wait_until(lambda at=target: _flushed_rounds(child.output) >= at or child.eof,
                           f"the child to flush {target} rounds", CHILD_PROGRESS_S)
                child.kill_after(rng.uniform(*KILL_DELAY_S))
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
    assert flushed_total >= ROUNDS_BEFORE_KILL[0] * ITERATIONS * 3 // 4, flushed_total
    assert replays > 0, "some kills should leave a WAL tail to replay"
    assert merged > 0, "some kills should come after merges of objects"
