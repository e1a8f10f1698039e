"""The 2018 Tianchi million-queue race, scaled by flags, on stratalog and on peers.

Three phases per system, each in its own process (so peak RSS is the system's own):

- send: ``threads`` producers, each owning every ``threads``-th queue, send round after round (one
  message to each of its queues per round) with ``put`` (or ``put_many`` of ``batch`` messages: names
  sliced from an Arrow string array built once for stratalog, from a list for the peers; messages as
  rows of a 2-D uint8 array), then call ``flush``: the phase ends when everything is durable.
- index check: every queue once, in random order, ``get(queue, random offset, 10)``, checking the first
  message and the count.
- consume: 20% of the queues read from offset 0 to the end with ``get(queue, offset, consume_batch)``,
  every message compared with what was sent; then, while the phase has run less than ``consume_s_min``,
  another fifth of the queues, and so on (each queue at most once): at a million queues one fifth takes
  about 5 s, too short for a steady figure.

For stratalog alone, two plain-disk references on the same files in the same run (see
:mod:`stratalog.bench.disk_reference`): random 4 KiB reads of the store's objects right after consume, with the
store still open, and a sequential write in its directory after close; ``ratios_to_disk`` sets the phases
against them. And one of the interpreter, after close: the bare put loop (see _interpreter_reference), which
says how fast this machine runs Python at the time of the run: these machines are shared, and a send that is
slower than the night before on a machine whose loop is too is the machine, not the code.

Message (queue q, round r): r as 4 little-endian bytes, then q as 4 bytes, then filler up to
``message_bytes``: every message is distinct and checkable without keeping it.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import operator
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from stratalog.bench import disk_reference
from stratalog.bench.common import disk_bytes, run_threads

if TYPE_CHECKING:
    from stratalog.queues import QueueConfig

#: The index check reads this many messages per get, as the million-queue race does.
INDEX_CHECK_NUM = 10
#: Share of queues the consume phase reads in full, as in the million-queue race (and then further
#: shares, while it has run less than the plan's consume_s_min).
CONSUME_SHARE = 0.2
PHASES = ("send", "index_check", "consume")
SYSTEMS = ("stratalog", "rocksdict", "lmdb", "sqlite3", "nats")
#: How long the interpreter reference runs its loop.
INTERPRETER_S = 2.0
#: Seconds between progress reports from a system's process.
PROGRESS_EVERY_S = 0.5


class QueueSystem(Protocol):
    """What the bench drives: QueueStore's API (peers adapt to it)."""

    def put(self, queue_name: str, message: bytes) -> None: ...

    def put_many(self, queue_names: Any, messages: Any) -> None: ...

    def flush(self) -> None: ...

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class QueueBenchPlan:
    queues: int
    messages: int
    message_bytes: int
    threads: int
    batch: int               # 0: put per message; else put_many of this many
    consume_batch: int
    dir_path: Path
    seed: int = 1
    #: The consume phase reads further shares of the queues until it has run this long (0: one share, the
    #: race's; the command's default is CONSUME_S_MIN there).
    consume_s_min: float = 0.0
    #: Bounds of stratalog's disk references (tests pass small ones).
    reference_read_s_max: float = disk_reference.READ_S_MAX
    reference_write_bytes: int = disk_reference.WRITE_BYTES
    #: stratalog's configuration; None: the defaults, under which a small run's data is still in the log
    #: cache when the read phases end (it uploads 256 MiB at a time), leaving the read reference no objects.
    #: Tests pass small bounds so their run uploads objects while it sends.
    store_config: QueueConfig | None = None

    @property
    def rounds(self) -> int:
        return max(1, self.messages // self.queues)

    @property
    def total_messages(self) -> int:
        return self.rounds * self.queues


def queue_names(queues: int) -> list[str]:
    return [f"queue-{q}" for q in range(queues)]


def message_tails(queues: int, message_bytes: int) -> list[bytes]:
    """What follows the round number in each queue's messages."""
    filler = bytes(range(256)) * (message_bytes // 256 + 1)
    return [(q.to_bytes(4, "little") + filler)[:message_bytes - 4] for q in range(queues)]


def expected(tails: list[bytes], q: int, r: int) -> bytes:
    return r.to_bytes(4, "little") + tails[q]


def open_system(name: str, data_dir: Path, plan: QueueBenchPlan) -> QueueSystem:
    data_dir.mkdir(parents=True, exist_ok=True)
    if name == "stratalog":
        from stratalog.queues import QueueStore

        return QueueStore.open(data_dir, config=plan.store_config)
    from stratalog.bench import queue_peers

    peer: QueueSystem = queue_peers.open_peer(name, data_dir, plan.queues)
    return peer


def _send(system: QueueSystem, plan: QueueBenchPlan, names: list[str], tails: list[bytes],
          progress: Any, *, arrow_names: bool = False) -> None:
    """With ``arrow_names``, put_many gets each batch's names as a slice of an Arrow string array the
    producer builds once (its queues' names do not change from round to round), else as a list slice:
    each system in the form it takes best (stratalog's put_many converts a list to Arrow on every call,
    ~30% of its send; the peers' put_many loops over Python strs)."""
    t_count = plan.threads

    def producer(t: int) -> None:
        mine = list(range(t, plan.queues, t_count))
        my_names = [names[q] for q in mine]
        my_tails = [tails[q] for q in mine]
        put = system.put
        if plan.batch:
            block = np.frombuffer(b"".join(b"\0\0\0\0" + tail for tail in my_tails), np.uint8)
            block = block.reshape(len(mine), plan.message_bytes).copy()
            batch_names: Any = pa.array(my_names, pa.string()) if arrow_names else my_names
            for r in range(plan.rounds):
                block[:, :4] = np.frombuffer(r.to_bytes(4, "little"), np.uint8)
                for i in range(0, len(mine), plan.batch):
                    system.put_many(batch_names[i:i + plan.batch], block[i:i + plan.batch])
                progress[0] += len(mine)
        else:
            for r in range(plan.rounds):
                rb = r.to_bytes(4, "little")
                for name, tail in zip(my_names, my_tails, strict=True):
                    put(name, rb + tail)
                progress[0] += len(mine)
        system.flush()

    run_threads(t_count, producer)


def _index_check(system: QueueSystem, plan: QueueBenchPlan, names: list[str], tails: list[bytes],
                 progress: Any) -> int:
    order = list(range(plan.queues))
    random.Random(plan.seed).shuffle(order)
    bad = [0]

    def checker(t: int) -> None:
        rng = random.Random(plan.seed + t)
        rounds = plan.rounds
        get = system.get
        done = 0
        for q in order[t::plan.threads]:
            off = rng.randrange(rounds)
            got = get(names[q], off, INDEX_CHECK_NUM)
            if len(got) != min(INDEX_CHECK_NUM, rounds - off) or got[0] != expected(tails, q, off):
                bad[0] += 1
            done += 1
            if done % 1024 == 0:
                progress[1] += 1024
        progress[1] += done % 1024

    run_threads(plan.threads, checker)
    return bad[0]


def expected_messages(tail: bytes, rounds: int) -> list[bytes]:
    """Every message of one queue (rounds 0 .. rounds - 1), built by C loops that keep the GIL."""
    return list(map(operator.add, round_prefixes(rounds), itertools.repeat(tail, rounds)))


@functools.cache
def round_prefixes(rounds: int) -> tuple[bytes, ...]:
    return tuple(r.to_bytes(4, "little") for r in range(rounds))


def _consume(system: QueueSystem, plan: QueueBenchPlan, names: list[str], tails: list[bytes],
             progress: Any) -> tuple[int, int, int]:
    """The messages read, the bad reads, and the queues read. Every message is checked: each get's
    messages must equal the queue's expected messages at those offsets, one by one (a list comparison, in
    C). The expected messages are built without NumPy: its copies give up the GIL, and beside 8 consumer
    threads each give-up is a hand-over (an early version made 690 k context switches in a phase of 15 s
    and cost every system alike a third of its rate)."""
    order = list(range(plan.queues))
    random.Random(plan.seed + 1).shuffle(order)
    share = max(1, int(plan.queues * CONSUME_SHARE))
    bad = [0]
    read = [0]

    def consumer(t: int, chosen: list[int]) -> None:
        get = system.get
        rounds = plan.rounds
        for q in chosen[t::plan.threads]:
            off = 0
            name = names[q]
            want = expected_messages(tails[q], rounds)
            while True:
                got = get(name, off, plan.consume_batch)
                if not got:
                    break
                if got != want[off:off + len(got)]:
                    bad[0] += 1
                off += len(got)
                progress[2] += len(got)
            read[0] += off
            if off != rounds:
                bad[0] += 1

    started = time.perf_counter()
    first = 0
    while first < plan.queues and (first == 0 or time.perf_counter() - started < plan.consume_s_min):
        chosen = sorted(order[first:first + share])   # in order of queue, as a consumer walks them
        run_threads(plan.threads, functools.partial(consumer, chosen=chosen))
        first += share
    return read[0], bad[0], min(first, plan.queues)


def run_system(name: str, plan: QueueBenchPlan, progress: Any) -> dict[str, Any]:
    """One system through the three phases; runs in its own process."""
    names = queue_names(plan.queues)
    tails = message_tails(plan.queues, plan.message_bytes)
    data_dir = plan.dir_path / name
    shutil.rmtree(data_dir, ignore_errors=True)
    system = open_system(name, data_dir, plan)
    phases: dict[str, dict[str, float]] = {}
    reference: dict[str, dict[str, Any]] = {}
    try:
        started = time.perf_counter()
        _send(system, plan, names, tails, progress, arrow_names=name == "stratalog")
        send_s = time.perf_counter() - started
        phases["send"] = {"seconds": send_s, "per_s": plan.total_messages / send_s}
        stats_after_send = _stats(system)
        disk_reads = _disk_read_bytes()
        started = time.perf_counter()
        index_bad = _index_check(system, plan, names, tails, progress)
        seconds = time.perf_counter() - started
        phases["index_check"] = {"seconds": seconds, "per_s": plan.queues / seconds, "gets": plan.queues,
                                 "bad": index_bad}
        stats_after_index = _stats(system)
        _add_object_reads(phases["index_check"], stats_after_send, stats_after_index)
        _add_disk_reads(phases["index_check"], disk_reads)
        disk_reads = _disk_read_bytes()
        started = time.perf_counter()
        consumed, consume_bad, consumed_queues = _consume(system, plan, names, tails, progress)
        seconds = time.perf_counter() - started
        phases["consume"] = {"seconds": seconds, "per_s": consumed / seconds, "messages": consumed,
                             "queues": consumed_queues, "bad": consume_bad}
        stats = _stats(system)
        _add_object_reads(phases["consume"], stats_after_index, stats)
        _add_disk_reads(phases["consume"], disk_reads)
        if name == "stratalog":
            reference["random_read_4k"] = _random_read_reference(data_dir, plan)
    finally:
        system.close()
    doc: dict[str, Any] = {
        "name": name, "mode": "put_many" if plan.batch else "put", "phases": phases,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "disk_bytes": disk_bytes(data_dir), "ok": index_bad == 0 and consume_bad == 0,
    }
    if stats:
        doc["stats_after_send"] = stats_after_send
        doc["stats"] = stats
    if name == "stratalog":
        doc["recovery"] = _crash_and_recover(data_dir, plan)
        reference["seq_write"] = _seq_write_reference(data_dir, plan)
        reference["interpreter_put_loop"] = _interpreter_reference(names, plan.message_bytes)
        doc["reference"] = reference
        doc["ratios_to_disk"] = ratios_to_disk(phases, reference, plan.message_bytes)
    shutil.rmtree(data_dir, ignore_errors=True)
    return doc


def _random_read_reference(data_dir: Path, plan: QueueBenchPlan) -> dict[str, Any]:
    """Random 4 KiB reads of every object file the store holds now, with the plan's threads, for at most
    as many reads as the index check made gets or ``plan.reference_read_s_max``. A merged-away object still
    waiting to be deleted counts too. No objects (a small run still all in the log cache): skipped, and
    said so, since the read phases then read no disk at all."""
    from stratalog.objects.uri import LOCAL_DIR_NAME
    from stratalog.queues.objects import QUEUE_PREFIX

    paths = sorted((data_dir / LOCAL_DIR_NAME / QUEUE_PREFIX).glob("*.slq"))
    if not paths:
        return {"threads": plan.threads, "files": 0,
                "skipped": "no objects yet: the read phases were served from the log cache"}
    try:
        reads = disk_reference.random_reads(paths, plan.threads, plan.queues, plan.reference_read_s_max, plan.seed)
    except OSError as e:
        return {"threads": plan.threads, "error": f"{type(e).__name__}: {e}"}
    return reads.summary()


def _interpreter_reference(names: list[str], message_bytes: int, seconds: float = INTERPRETER_S) -> dict[str, Any]:
    """The bare put loop, in one thread, for about ``seconds``: look the queue's name up in a dict of every
    queue's id, append name, message and id to a list (cleared every 64 Ki puts), queue after queue in
    order, with one message object: the kind of work a put and its writer do per message (the store's
    put leaves the lookup to the writer, which does it for a batch), as plain Python. It moves with the
    machine's load, and says how fast this machine runs Python at the time of the run. Run
    after the store closed, so its dict (~100 B per queue) does not raise the store's peak RSS."""
    ids = dict(zip(names, range(len(names)), strict=True))
    message = bytes(message_bytes)
    buf: list[Any] = []
    puts = 0
    chunk = 1 << 16
    started = time.perf_counter()
    while True:
        for at in range(0, len(names), chunk):
            for name in names[at:at + chunk]:
                buf.extend((name, message, ids.get(name, -1)))
            buf.clear()
            puts += min(chunk, len(names) - at)
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return {"threads": 1, "queues": len(names), "puts": puts, "seconds": elapsed,
                        "per_s": puts / elapsed}


def _seq_write_reference(data_dir: Path, plan: QueueBenchPlan) -> dict[str, Any]:
    """1 MiB O_DIRECT writes of ``plan.reference_write_bytes`` to a new file in the store's directory, with
    the messages per second the disk could take at that rate. A failure (a full disk) is reported, not
    raised: it must not lose the phases' figures."""
    try:
        written = disk_reference.sequential_write(data_dir, plan.reference_write_bytes)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {**written.summary(), "messages_per_s": written.bytes_per_s / plan.message_bytes}


def ratios_to_disk(phases: dict[str, dict[str, float]], reference: dict[str, dict[str, Any]],
                   message_bytes: int) -> dict[str, float]:
    """Each phase's rate over the disk's, from the references taken in the same run:

    - index_check: gets/s over random 4 KiB reads/s (1: a get costs what one random read does);
    - consume: message bytes/s over random-read bytes/s (reads/s x 4 KiB): the bytes a consumer gets for
      each byte the disk returns to random reads;
    - send: messages/s over the messages/s the sequential write could take (its bytes/s over
      message_bytes, bare messages; the store writes more: framing, the WAL and then objects);
    - index_check_reads, consume_reads: the object reads the phase's gets made per second over random
      reads/s (1: the phase keeps the disk as busy with reads as the reference did; each get's read is of
      the whole 4 KiB pages its run lies in, one or more).

    A ratio is left out when its reference is (skipped, or failed)."""
    out: dict[str, float] = {}
    reads = reference.get("random_read_4k", {})
    if reads.get("per_s"):
        out["index_check"] = phases["index_check"]["per_s"] / reads["per_s"]
        out["consume"] = phases["consume"]["per_s"] * message_bytes / reads["bytes_per_s"]
        for phase in ("index_check", "consume"):
            if "object_reads_per_s" in phases[phase]:
                out[f"{phase}_reads"] = phases[phase]["object_reads_per_s"] / reads["per_s"]
    writes = reference.get("seq_write", {})
    if writes.get("messages_per_s"):
        out["send"] = phases["send"]["per_s"] / writes["messages_per_s"]
    return out


def _add_object_reads(phase: dict[str, float], before: dict[str, int], after: dict[str, int]) -> None:
    """The object reads the phase's gets made (a system that counts them: stratalog), and their rate."""
    if "object_reads" in after:
        phase["object_reads"] = after["object_reads"] - before["object_reads"]
        phase["object_read_bytes"] = after["object_read_bytes"] - before["object_read_bytes"]
        phase["object_reads_per_s"] = phase["object_reads"] / phase["seconds"]
        phase["object_reads_waited"] = after["object_reads_waited"] - before["object_reads_waited"]


def _disk_read_bytes() -> int | None:
    """Bytes this process has had read from storage (not from the page cache); None off Linux."""
    try:
        with open("/proc/self/io", encoding="ascii") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return None


def _add_disk_reads(phase: dict[str, float], before: int | None) -> None:
    """What of the phase came from the disk: a read phase on a page cache the machine keeps is memory-bound,
    one the machine has let go of (the kernel, or a host's reclaim of idle pages) is the disk's."""
    after = _disk_read_bytes()
    if before is not None and after is not None:
        phase["disk_read_bytes"] = after - before


def _stats(system: QueueSystem) -> dict[str, int]:
    stats = getattr(system, "stats", None)
    return dict(stats()) if callable(stats) else {}


#: Run in a child by _crash_and_recover: open the store, put one more round to every queue, flush, report
#: the open time, then SIGKILL itself (no close: the WAL keeps the round, the uploader is cut off).
_CRASH_CHILD = """
import os, signal, sys, time
from stratalog.bench.queues import expected, message_tails, queue_names
from stratalog.queues import QueueStore
path, queues, message_bytes, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
started = time.perf_counter()
store = QueueStore.open(path)
print(time.perf_counter() - started, flush=True)
names, tails = queue_names(queues), message_tails(queues, message_bytes)
for q in range(queues):
    store.put(names[q], expected(tails, q, rounds))
store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def _crash_and_recover(data_dir: Path, plan: QueueBenchPlan) -> dict[str, Any]:
    """Reopen after a clean close (timed in a child), put and flush one more message per queue there, kill
    it with SIGKILL, then time the open that recovers: object indexes plus the WAL tail, never the data."""
    child = subprocess.run([sys.executable, "-c", _CRASH_CHILD, str(data_dir), str(plan.queues),
                            str(plan.message_bytes), str(plan.rounds)], capture_output=True, text=True, check=False)
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the crash child ended with {child.returncode}: {child.stderr[-2000:]}")
    from stratalog.queues import QueueStore

    started = time.perf_counter()
    store = QueueStore.open(data_dir)
    seconds = time.perf_counter() - started
    report = asdict(store.recovery)
    names, tails = queue_names(plan.queues), message_tails(plan.queues, plan.message_bytes)
    lost = sum(store.get(names[q], plan.rounds, 1) != [expected(tails, q, plan.rounds)]
               for q in range(0, plan.queues, max(1, plan.queues // 1000)))
    store.close()
    return {"clean_open_seconds": float(child.stdout.split()[0]), "open_after_kill9_seconds": seconds,
            "flushed_round_missing_in_sampled_queues": lost, **report}


def _child(name: str, plan: QueueBenchPlan, progress: Any, results: Any) -> None:
    try:
        results.put(run_system(name, plan, progress))
    except BaseException as e:
        results.put({"name": name, "error": f"{type(e).__name__}: {e}"})
        raise


def run_in_process(name: str, plan: QueueBenchPlan, on_progress: Callable[[list[int]], None]) -> dict[str, Any]:
    """Run one system in a fresh process; report progress counters (sent, checked, consumed) meanwhile."""
    ctx = mp.get_context("spawn")
    progress = ctx.Array("q", 3, lock=False)
    results = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, plan, progress, results), name=f"bench-{name}")
    proc.start()
    result: dict[str, Any] | None = None
    while result is None:
        try:
            result = results.get(timeout=PROGRESS_EVERY_S)
        except Exception:
            if not proc.is_alive() and results.empty():
                result = {"name": name, "error": f"the {name} process died (exit code {proc.exitcode})"}
        on_progress(list(progress))
    proc.join()
    return result


def ratios(systems: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """stratalog's rate over the fastest peer's, per phase."""
    ours = next((s for s in systems if s["name"] == "stratalog" and "phases" in s), None)
    peers = [s for s in systems if s["name"] != "stratalog" and "phases" in s]
    out: dict[str, dict[str, float]] = {}
    if ours is None or not peers:
        return out
    for phase in PHASES:
        best = max(peers, key=lambda s: s["phases"][phase]["per_s"])
        out[phase] = {"fastest_peer": best["name"], "ratio": ours["phases"][phase]["per_s"]
                      / best["phases"][phase]["per_s"]}
    return out
