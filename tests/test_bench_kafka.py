"""`stratalog bench kafka` at a tiny scale: every peer measured (or skipped with a reason), no server left."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stratalog.bench.kafka_txn import READ_ROUNDS_MAX

LATENCY_KEYS = {"p0", "p50", "p90", "p99", "p99_9", "p99_99", "p99_9999", "max", "mean", "samples"}
#: The whole run: three servers started and stopped, two latency sizes at 1 s, two throughput sizes, each
#: waiting for stratalog's upload interval before its read from objects and after each of its own produce
#: runs (recompressed, transactional, idempotent).
RUN_TIMEOUT_S = 300
#: stratalog's upload interval in the run: the waits for uploads follow it (5 s by default). Long enough
#: that a transactional tail run of 2,000 messages is produced and read back in more than one round (a read
#: at each isolation level, about half a second each) before the next upload.
UPLOAD_INTERVAL_S = 5


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_bench_kafka_measures_every_peer_and_leaves_no_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    json_path = tmp_path / "bench-kafka.json"
    plot_path = tmp_path / "bench-kafka.png"
    config_path = tmp_path / "broker.toml"
    config_path.write_text(f"[store]\nupload_interval_s = {UPLOAD_INTERVAL_S}\n")
    run = subprocess.run(
        [sys.executable, "-c", "from stratalog.cli import main; main()", "bench", "kafka", "--duration-s", "1",
         "--sizes", "256,1KiB", "--messages", "2000", "--producers", "2", "--data-dir", str(data_dir),
         "--broker-config", str(config_path), "--json", str(json_path), "--plot", str(plot_path)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(json_path.read_text())
    assert plot_path.stat().st_size > 0
    assert [p["name"] for p in doc["peers"]] == ["stratalog", "nats", "tansu"]
    disk = doc["disk_reference"]
    assert disk["name"] == "disk (4 KiB O_DIRECT+O_DSYNC write)"
    if "error" not in disk:  # a data directory on tmpfs refuses O_DIRECT: reported, not measured
        assert set(disk["produce_ms"]) == LATENCY_KEYS
        assert disk["produce_ms"]["samples"] == disk["sent"] == 50
    for peer in doc["peers"]:
        if peer["status"] == "skipped":
            assert peer["reason"], peer  # never silently
            continue
        assert peer["status"] == "ran"
        assert not _alive(peer["server"]["pid"]), peer["server"]
        assert peer["server"]["address"].startswith("127.0.0.1:")
        assert [r["message_bytes"] for r in peer["latency"]] == [256, 1024]
        for r in peer["latency"]:
            assert "error" not in r, r
            assert set(r["produce_ms"]) == LATENCY_KEYS
            assert set(r["end_to_end_ms"]) == LATENCY_KEYS
            assert r["produce_ms"]["samples"] == r["sent"] == 50
            assert r["produce_ms"]["p0"] <= r["produce_ms"]["p50"] <= r["produce_ms"]["max"]
        assert [r["message_bytes"] for r in peer["throughput"]] == [100, 1024]
        for r in peer["throughput"]:
            # 2,000 messages are far below half the upload threshold: the produce run is the tail run.
            assert r["tail_run"]["is_produce_run"] and r["tail_run"]["messages"] == 2000
            # librdkafka's default, named: over a topic without transactions it reads every record.
            assert peer["name"] == "nats" or r["consume_tail"]["isolation_level"] == "read_committed", r
            if peer["name"] == "stratalog":
                # Read before the upload was due: from the log cache (later, on a busy machine, maybe not).
                tail = r["consume_tail"]
                assert tail["from_log_cache"] is True or not tail["within_upload_interval"], r
                assert r["consume_cold"]["uploaded_before_read"] is True, r
                recompressed = r["produce_recompressed"]  # the same run into a compression.type=zstd topic
                assert recompressed["ok"] and recompressed["messages"] == 2000, r
                assert recompressed["topic_configs"] == {"compression.type": "zstd"}
                _assert_transactional_phases(r["transactional"], r["message_bytes"])
            else:
                assert "produce_recompressed" not in r
                assert r["transactional"]["not_applicable"], r  # said why, not silently absent
            if peer["name"] == "tansu":
                assert r["consume_cold"]["not_applicable"], r  # memory storage: nothing to read cold
            for phase in ("produce", "consume_tail", "consume_cold"):
                if "not_applicable" in r[phase]:
                    assert peer["name"] == "tansu"
                    continue
                assert r[phase]["expected"] == 2000
                if peer["name"] != "stratalog" and not r[phase]["ok"]:
                    # A peer's own shortfall is reported, not hidden (Tansu's consumer now and then gets
                    # one producer's messages only); stratalog's must be whole.
                    assert r[phase]["messages"] < r[phase]["expected"], (peer["name"], r)
                    continue
                assert r[phase]["ok"], (peer["name"], r)
                assert r[phase]["messages"] == 2000
                assert r[phase]["msg_per_s"] > 0
                assert r[phase]["mb_per_s"] > 0
            # Where the CPUs went: the producer processes' time per message, and the server's (counted in
            # clock ticks: a tiny run may take less than one).
            assert r["produce"]["producer_cpu_us_per_msg"] > 0, r["produce"]
            assert r["produce"]["server_cpu_us_per_msg"] >= 0, r["produce"]
    # stratalog runs in this environment; its peers may be skipped, but then with a reason (above).
    assert doc["peers"][0]["status"] == "ran", doc["peers"][0]
    assert set(doc["ratios"]) <= {"stratalog/nats", "stratalog/tansu", "stratalog/disk"}
    assert [t["met"] in (True, False) for t in doc["targets"]]
    report = subprocess.run(
        [sys.executable, "-c", "from stratalog.cli import main; main()", "bench", "kafka", "--report", str(json_path)],
        capture_output=True, text=True, timeout=60, check=True)
    assert "| stratalog | 256 B |" in report.stdout and "| target |" in report.stdout
    assert "| stratalog, compression.type=zstd | 100 B | 2,000 |" in report.stdout
    assert "every batch recompressed into zstd" in report.stdout
    assert "Transactions: the plain throughput producers, each with a transactional.id" in report.stdout
    for peer in doc["peers"][1:]:  # one row each, saying why they have no transactional phases
        if peer["status"] == "ran":
            assert f"| {peer['name']} | - |" in report.stdout, peer["name"]
    targets = {t["name"]: t for t in doc["targets"]}
    for name in ("transactional produce (a commit every 100 ms) >= 0.8x the plain produce, each size",
                 "read_committed tail consume >= 0.9x read_uncommitted, each size"):
        assert targets[name]["figure"] > 0, targets[name]  # measured at both sizes
        assert f"| {name} |" in report.stdout
    assert not _processes_mentioning(str(data_dir))


def _assert_transactional_phases(txn: dict[str, Any], size: int) -> None:
    """Every message of stratalog's transactional run committed and read back at both isolation levels;
    the idempotent reference took them all too."""
    assert txn["commit_interval_ms"] == 100
    # 2,000 messages are far below half the upload threshold: the produce run is the tail run.
    assert txn["tail_run"] == {"topic": f"txn-{size}", "messages": 2000, "is_produce_run": True}
    produce = txn["produce"]
    assert produce["ok"] and produce["errors"] == [], produce
    assert produce["messages"] == produce["committed"] == 2000 and produce["aborted"] == 0, produce
    assert produce["transactions"] >= 2, produce  # each of the two producers committed
    assert produce["transactions"] == produce["end_txn_ms"]["samples"] == produce["flush_ms"]["samples"]
    assert 0 < produce["flush_share"] + produce["end_txn_share"] <= 1, produce
    assert produce["producer_cpu_us_per_msg"] > 0 and produce["server_cpu_us_per_msg"] >= 0, produce
    idempotent = txn["produce_idempotent"]
    assert idempotent["ok"] and idempotent["messages"] == 2000, idempotent
    assert idempotent["producer_configs"] == {"enable.idempotence": True}
    tail = txn["consume_tail"]
    assert tail["from_log_cache"] is True or not tail["within_upload_interval"], tail
    rounds = len(tail["read_committed"]["reads"])
    assert 1 <= rounds <= READ_ROUNDS_MAX, tail  # rounds go on while the upload interval leaves room
    for level in ("read_uncommitted", "read_committed"):
        read = tail[level]
        assert read["isolation_level"] == level and read["ok"] and read["messages"] == 2000, read
        assert [(x["isolation_level"], x["messages"]) for x in read["reads"]] == [(level, 2000)] * rounds, read
        assert read["msg_per_s"] == statistics.median(x["msg_per_s"] for x in read["reads"])


def test_the_upload_waits_and_the_tail_run_follow_the_broker_config(tmp_path: Path) -> None:
    from stratalog.bench.kafka import UPLOAD_WAIT_MARGIN_S, KafkaBenchPlan
    from stratalog.engine.config import StoreConfig

    def plan(config: Path | None) -> KafkaBenchPlan:
        return KafkaBenchPlan(peers=("stratalog",), latency_sizes_bytes=(256,), duration_s=1, rate_per_s=50,
                              throughput_sizes_bytes=(1024,), messages=10**9, producers=1, data_dir=tmp_path,
                              broker_config=config)

    defaults = StoreConfig()
    assert plan(None).upload_wait_s == defaults.upload_interval_s + UPLOAD_WAIT_MARGIN_S
    assert plan(None).tail_messages(1024) == defaults.upload_bytes_threshold // 2 // 1024
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.5\nupload_bytes_threshold = 1048576\n")
    assert plan(config).upload_wait_s == 0.5 + UPLOAD_WAIT_MARGIN_S
    assert plan(config).tail_messages(1024) == 512


def test_a_read_that_gets_nothing_more_stops_and_reports_the_shortfall(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from brokerkit import running_broker
    from stratalog.bench import kafka as bench_kafka

    monkeypatch.setattr(bench_kafka, "CONSUME_IDLE_S_MAX", 1.0)
    with running_broker(tmp_path / "data") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("short", 1)])["short"].result(30)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(10):
            producer.produce("short", b"m%d" % i)
        assert producer.flush(30) == 0
        result = bench_kafka.kafka_consume_throughput(broker.bootstrap, "short", 2, 20, lambda _: None)
        assert broker.stop() == 0
    assert result["messages"] == 10 and result["expected"] == 20 and result["ok"] is False
    assert any("nothing more came in 1 s" in e for e in result["errors"]), result
