"""`stratalog bench queues` and its phases at a small scale: the JSON it writes, its references against the
disk, its peers, and the checks its send and consume phases make."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stratalog.bench.queues import QueueBenchPlan, run_system
from stratalog.commands.bench_queues import queues as bench_queues_command
from stratalog.queues import QueueConfig, QueueStore


def test_bench_command_quick_run_writes_the_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_queues_command, ["--queues", "2000", "--messages", "20000", "--threads", "2",
                                                       "--only", "stratalog", "--dir", str(tmp_path / "b"),
                                                       "--reference-read-s", "1", "--reference-write-mib", "8",
                                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["bench"] == "queues" and doc["queues"] == 2000 and doc["messages"] == 20000
    assert doc["load_average_1m"]["start"] >= 0 and doc["load_average_1m"]["end"] >= 0   # (a busy start is flagged)
    (system,) = doc["systems"]
    assert system["name"] == "stratalog" and system["mode"] == "put" and system["ok"]
    for phase in ("send", "index_check", "consume"):
        assert system["phases"][phase]["per_s"] > 0
    assert system["peak_rss_bytes"] > 0 and system["disk_bytes"] > 0
    recovery = system["recovery"]  # after kill -9 of a child that flushed one more message per queue
    assert recovery["flushed_round_missing_in_sampled_queues"] == 0
    assert recovery["messages_replayed"] == 2000 and recovery["open_after_kill9_seconds"] > 0
    assert "against this disk" in result.output and "the bare put loop" in result.output
    reads, writes = system["reference"]["random_read_4k"], system["reference"]["seq_write"]
    assert writes["bytes"] == 8 << 20 and writes["seconds"] > 0
    assert system["ratios_to_disk"]["send"] == pytest.approx(system["phases"]["send"]["per_s"]
                                                             / writes["messages_per_s"])
    # At this scale the data may all be in the log cache still: then the read reference says so.
    assert ("index_check" in system["ratios_to_disk"]) == (reads["files"] > 0)
    assert reads["files"] > 0 or reads["skipped"]


def test_bench_sets_stratalogs_phases_against_the_disk_in_the_same_run(tmp_path: Path) -> None:
    """A log cache smaller than the data makes the store upload while it sends, so the read reference has
    objects to read; each ratio is the phase's rate over the reference's."""
    config = QueueConfig(upload_bytes_threshold=256 << 10, log_cache_bytes_max=1 << 20,
                         pending_messages_wake=2048, linger_s=0.002)
    plan = QueueBenchPlan(queues=2000, messages=40000, message_bytes=58, threads=2, batch=0, consume_batch=100,
                          dir_path=tmp_path, reference_read_s_max=1.0, reference_write_bytes=8 << 20,
                          store_config=config)
    doc = run_system("stratalog", plan, [0, 0, 0])
    assert doc["ok"] and not (tmp_path / "stratalog").exists()
    phases, reference, ratios = doc["phases"], doc["reference"], doc["ratios_to_disk"]
    reads, writes = reference["random_read_4k"], reference["seq_write"]
    assert reads["threads"] == 2 and reads["files"] > 0 and reads["file_bytes"] > 0
    assert 0 < reads["reads"] <= plan.queues and reads["seconds"] > 0
    assert reads["per_s"] == pytest.approx(reads["reads"] / reads["seconds"])
    assert reads["bytes_per_s"] == pytest.approx(reads["per_s"] * reads["block_bytes"])
    assert writes["bytes"] == 8 << 20 and writes["seconds"] > 0 and writes["direct"] in (True, False)
    assert writes["mib_per_s"] == pytest.approx(writes["bytes"] / writes["seconds"] / (1 << 20))
    assert writes["messages_per_s"] == pytest.approx(writes["bytes"] / writes["seconds"] / plan.message_bytes)
    assert ratios["index_check"] == pytest.approx(phases["index_check"]["per_s"] / reads["per_s"])
    assert ratios["consume"] == pytest.approx(phases["consume"]["per_s"] * plan.message_bytes
                                              / (reads["per_s"] * reads["block_bytes"]))
    assert ratios["send"] == pytest.approx(phases["send"]["per_s"] / writes["messages_per_s"])
    loop = reference["interpreter_put_loop"]
    assert loop["queues"] == plan.queues and loop["seconds"] >= 2.0 and loop["puts"] >= plan.queues
    assert loop["per_s"] == pytest.approx(loop["puts"] / loop["seconds"])
    # The gets' own object reads: whole 4 KiB pages, at least one read per get that reached an object.
    for phase in ("index_check", "consume"):
        p = phases[phase]
        assert p["object_reads"] > 0 and p["object_read_bytes"] >= 4096 * p["object_reads"] * 0.5
        assert p["object_reads_per_s"] == pytest.approx(p["object_reads"] / p["seconds"])
        assert ratios[f"{phase}_reads"] == pytest.approx(p["object_reads_per_s"] / reads["per_s"])
        assert 0 <= p["object_reads_waited"] <= p["object_reads"]
        assert p["disk_read_bytes"] >= 0     # Linux: /proc/self/io
    assert doc["stats"]["object_reads"] == phases["index_check"]["object_reads"] + phases["consume"]["object_reads"]


@pytest.mark.slow
def test_bench_peers_run_the_same_workload_and_nats_is_stopped(tmp_path: Path) -> None:
    """Every peer (RocksDB, LMDB, SQLite, and a NATS JetStream server the bench starts on 127.0.0.1) runs
    the three phases on the same queues, every message read back is checked, and no server is left."""
    out = tmp_path / "peers.json"
    result = CliRunner().invoke(bench_queues_command, ["--queues", "200", "--messages", "4000", "--threads", "2",
                                                       "--peers", "--dir", str(tmp_path / "b"),
                                                       "--reference-read-s", "1", "--reference-write-mib", "8",
                                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    systems = {s["name"]: s for s in doc["systems"]}
    assert set(systems) == {"stratalog", "rocksdict", "lmdb", "sqlite3", "nats"}
    for name, system in systems.items():
        assert system["ok"], name
        assert system["phases"]["index_check"]["bad"] == 0 and system["phases"]["consume"]["bad"] == 0, name
        # A fifth of the queues, then the next, ... until 10 s had passed: at this size, every queue once.
        assert system["phases"]["consume"]["messages"] == 4000, name
        assert system["phases"]["consume"]["queues"] == 200, name
    assert set(doc["ratios"]) >= {"send", "index_check", "consume"}
    leftover = subprocess.run(["pgrep", "-f", f"nats-server.*{tmp_path}"], capture_output=True, check=False)
    assert leftover.returncode == 1, "the bench left a nats-server running"


class _ListQueues:
    """A queue system of lists, for checking the bench's own checks."""

    def __init__(self) -> None:
        self.queues: dict[str, list[bytes]] = {}

    def put(self, queue_name: str, message: bytes) -> None:
        self.queues.setdefault(queue_name, []).append(message)

    def put_many(self, queue_names: list[str], messages: Any) -> None:
        """Names as a list; messages as rows of a 2-D uint8 array (the bench's put_many mode)."""
        for name, message in zip(queue_names, messages, strict=True):
            self.put(name, bytes(message))

    def flush(self) -> None:
        pass

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        return self.queues.get(queue_name, [])[offset:offset + num]

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("consume_s_min", "shares"), [(0.0, 1), (3600.0, 5)])
def test_bench_consume_reads_a_fifth_then_more_fifths_until_it_ran_long_enough(
        tmp_path: Path, consume_s_min: float, shares: int) -> None:
    """The race reads a fifth of the queues; the bench goes on with further fifths, each queue at most
    once, while the phase has run less than consume_s_min."""
    from stratalog.bench.queues import _consume, _send, message_tails, queue_names

    plan = QueueBenchPlan(queues=100, messages=1000, message_bytes=20, threads=2, batch=0, consume_batch=3,
                          dir_path=tmp_path, consume_s_min=consume_s_min)
    names, tails = queue_names(plan.queues), message_tails(plan.queues, plan.message_bytes)
    fake = _ListQueues()
    _send(fake, plan, names, tails, [0, 0, 0])
    asked: list[str] = []
    get = fake.get

    def counted_get(name: str, offset: int, num: int) -> list[bytes]:
        if offset == 0:
            asked.append(name)
        return get(name, offset, num)

    fake.get = counted_get  # type: ignore[method-assign]
    progress = [0, 0, 0]
    read, bad, queues = _consume(fake, plan, names, tails, progress)
    assert bad == 0 and queues == 20 * shares
    assert read == progress[2] == 20 * shares * plan.rounds
    assert len(asked) == len(set(asked)) == 20 * shares, "each queue read once, from its start"


@pytest.mark.parametrize("arrow_names", [False, True])
def test_bench_send_with_put_many_puts_every_message_in_order(tmp_path: Path, arrow_names: bool) -> None:
    """The send phase's put_many mode (batches smaller than a producer's queues, so a round spans several
    calls) gives every queue its messages round by round, whether the names come as a list or an Arrow
    array; the store takes either, and the consume phase then finds every message."""
    from stratalog.bench.queues import _consume, _send, expected, message_tails, queue_names

    plan = QueueBenchPlan(queues=300, messages=3000, message_bytes=20, threads=2, batch=64, consume_batch=7,
                          dir_path=tmp_path)
    names, tails = queue_names(plan.queues), message_tails(plan.queues, plan.message_bytes)
    fake = _ListQueues()
    _send(fake, plan, names, tails, [0, 0, 0])
    assert fake.queues == {names[q]: [expected(tails, q, r) for r in range(plan.rounds)] for q in range(plan.queues)}
    progress = [0, 0, 0]
    with QueueStore.open(tmp_path / "store") as qs:
        _send(qs, plan, names, tails, progress, arrow_names=arrow_names)
        assert progress[0] == plan.total_messages
        for q in (0, 1, 150, 299):
            assert qs.get(names[q], 0, plan.rounds + 1) == fake.queues[names[q]]
        read, bad, _ = _consume(qs, plan, names, tails, [0, 0, 0])
    assert bad == 0 and read == plan.rounds * int(plan.queues * 0.2)


@pytest.mark.parametrize("damage", ["none", "byte", "split", "short"])
def test_bench_consume_checks_every_message(tmp_path: Path, damage: str) -> None:
    """The consume phase compares each get's messages one by one: a changed byte, two messages with their
    boundary moved, or a missing last message all count as bad."""
    from stratalog.bench.queues import _consume, expected, expected_messages, message_tails, queue_names

    plan = QueueBenchPlan(queues=50, messages=1000, message_bytes=20, threads=2, batch=0, consume_batch=7,
                          dir_path=tmp_path)
    names, tails = queue_names(plan.queues), message_tails(plan.queues, plan.message_bytes)
    assert expected_messages(tails[3], plan.rounds) == [expected(tails, 3, r) for r in range(plan.rounds)]
    system = _ListQueues()
    for r in range(plan.rounds):
        for q in range(plan.queues):
            system.put(names[q], expected(tails, q, r))
    messages = [m for name in names for m in system.queues[name]]
    assert len(messages) == plan.total_messages
    for name in names:  # whichever queues the phase picks, each of them is damaged the same way
        queue = system.queues[name]
        if damage == "byte":
            queue[9] = queue[9][:5] + bytes([queue[9][5] ^ 1]) + queue[9][6:]
        elif damage == "split":
            queue[9], queue[10] = queue[9] + queue[10][:1], queue[10][1:]
        elif damage == "short":
            queue.pop()
    read, bad, _ = _consume(system, plan, names, tails, [0, 0, 0])
    assert read == (10 * plan.rounds if damage != "short" else 10 * (plan.rounds - 1))
    assert bad == (0 if damage == "none" else 10)
