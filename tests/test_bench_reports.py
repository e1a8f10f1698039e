"""`stratalog bench <name> --markdown-from JSON`: each bench's BENCHMARKS.md tables, made from a small run's JSON.

The documents are cut down by hand to the fields each renderer reads; the expected lines are written out in
full, so a renderer that drops, swaps or misformats a figure fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stratalog.cli import cli

MACHINE = {"cpus": 2, "cpu_model": "AMD EPYC", "memory_mib": 24_105, "kernel": "6.18.44", "python": "3.11.7",
           "filesystem": "ext4", "mount_point": "/", "disk_device": "/dev/vda"}
PROVENANCE = {"date": "2026-11-26T07:30:00+00:00", "commit": "abc1234", "machine": MACHINE,
              "other_activity": {"other_cpu_s": 1.25, "steal_cpu_s": 0.5, "other_disk_write_mib": 3.0}}
PROVENANCE_LINE = ("Measured 2026-11-26 07:30 UTC at commit abc1234 by `{command}` on 2 x AMD EPYC, 24 GiB, ext4 "
                   "on /dev/vda; meanwhile other processes used 1 CPU-s and wrote 3 MiB to the disk.")


def test_a_run_begun_on_a_busy_machine_says_so_in_its_first_line() -> None:
    from stratalog.bench.tables import provenance

    quiet = {**PROVENANCE, "load_average_1m": {"start": 2.0, "end": 9.0}}   # (only the start is the machine's)
    busy = {**PROVENANCE, "load_average_1m": {"start": 10.12, "end": 3.0}}
    assert provenance(quiet) == provenance(PROVENANCE)
    assert provenance(busy) == provenance(PROVENANCE)[:-1] + ("; **busy: a load average of 10.1 on 2 CPUs at the "
                                                              "start**.")


def _render(tmp_path: Path, bench: str, docs: list[dict[str, Any]], *extra: str) -> list[str]:
    args = ["bench", bench]
    for n, doc in enumerate(docs):
        path = tmp_path / f"{bench}-{n}.json"
        path.write_text(json.dumps(doc))
        args += ["--markdown-from", str(path)]
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _target(name: str, figure: float, bound: float, at_least: bool) -> dict[str, Any]:
    met = figure >= bound if at_least else figure <= bound
    return {"name": name, "figure": figure, "bound": bound, "at_least": at_least, "met": met, "applies": True}


def _latency(p50: float, p99: float) -> dict[str, float]:
    return {"avg": p50, "p50": p50, "p90": (p50 + p99) / 2, "p99": p99, "p99_9": p99 + 1, "p99_99": p99 + 2,
            "p999": p99 + 1, "max": p99 + 3, "samples": 1500}


def wal_doc() -> dict[str, Any]:
    def size(record_bytes: int, per_s: float, ratio: float, half_p99: float) -> dict[str, Any]:
        r = {"record_bytes": record_bytes, "records_per_s": per_s, "mib_per_s": per_s * record_bytes / 2**20,
             "iops": 900.0, "block_bytes_mean": 250_880.0, "reference_mib_per_s": 457.25, "ratio_to_reference": ratio,
             "latency_ms": _latency(100.0, 318.5), "half_rate_records_per_s": per_s / 2,
             "half_rate_latency_ms": _latency(1.09, half_p99),
             "half_rate_reference": {"latency_ms_in_order": _latency(0.5, 1.28)}}
        r["targets"] = [_target("p99 ms", half_p99, 2.0, at_least=False)]
        if record_bytes == 1024:
            r["targets"].insert(0, _target("records/s", per_s, 150_000, at_least=True))
        else:
            r["targets"].insert(0, _target("ratio", ratio, 0.9, at_least=True))
        return r

    recovery = {"record_bytes": 4096, "wal_bytes": 1 << 30, "records": 258_033, "seconds": 1.75, "mib_per_s": 585.5,
                "reference_mib_per_s": 1974.3, "ratio_to_reference": 0.2966, "seconds_runs": [1.88, 1.75],
                "reference_mib_per_s_runs": [1961.0, 1916.0, 1974.3],
                "targets": [_target("ratio", 0.2966, 0.5, at_least=True)]}
    return {"bench": "wal", "fsync": "always", "command": "stratalog bench wal --seconds 10", **PROVENANCE,
            "settings": {"rate_mib_per_s": None},
            "results": [size(1024, 214_628.4, 0.4583, 3.3), size(262_144, 2056.0, 0.99, 1.97)],
            "recovery": recovery}


def test_wal_tables_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "wal.png"
    lines = _render(tmp_path, "wal", [wal_doc()], "--plot", str(plot))
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench wal --seconds 10")
    assert "| record | fsync | records/s | MiB/s | IOPS | write KiB | ref MiB/s | ratio | target |  |" in lines
    assert "| 1 KiB | always | 214,628 | 209.6 | 900 | 245 | 457.2 | 0.46 | records/s >= 150,000 | met |" in lines
    assert "| 256 KiB | always | 2,056 | 514.0 | 900 | 245 | 457.2 | 0.99 | ratio >= 0.9 | met |" in lines
    assert "| 1 KiB | always | 318.5 | 107,314 | 1.09 | 1.09 | 3.30 | 6.30 | 1.28 | p99 ms <= 2 | **missed** |" in lines
    assert "| 256 KiB | always | 318.5 | 1,028 | 1.09 | 1.09 | 1.97 | 4.97 | 1.28 | p99 ms <= 2 | met |" in lines
    assert "| 1,024 | always | 258,033 | 1.75 | 585.5 | 1,974.3 | 0.30 | ratio >= 0.5 | **missed** |" in lines
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def log_doc() -> dict[str, Any]:
    def latency(record_bytes: int, p50: float, p99: float) -> dict[str, Any]:
        return {"record_bytes": record_bytes, "count": 1500, "latency_ms": _latency(p50, p99)}

    return {"bench": "log", "fsync": "always", "command": "stratalog bench log", **PROVENANCE,
            "settings": {"rate_per_s": 50.0, "seconds_per_size": 30.0, "in_flight_max": 1000},
            "latency": [latency(256, 0.85, 1.29), latency(1 << 20, 3.32, 167.37)],
            "reference": {"count": 1500, "latency_ms": _latency(0.61, 0.84)},
            "throughput": [{"record_bytes": 256, "records": 100_000, "seconds": 2.1, "records_per_s": 47_593.2,
                            "mib_per_s": 11.62, "one_at_a_time": {"records_per_s": 1443.0, "mib_per_s": 0.35}}],
            "targets": [{**_target("256 B p99 ms", 1.29, 1.0, at_least=False), "reference_p99_ms": 0.84,
                         "ratio_to_reference": 1.29 / 0.84}]}


def test_log_tables_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "log.png"
    lines = _render(tmp_path, "log", [log_doc()], "--plot", str(plot))
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench log")
    assert ("| 256 B | always | 1,500 | 0.85 | 1.07 | 1.29 | 2.29 | 3.29 | 4.29 | 256 B p99 ms <= 1 | **missed** |"
            in lines)
    assert "| 1 MiB | always | 1,500 | 3.32 | 85.34 | 167 | 168 | 169 | 170 | - | - |" in lines
    assert "| ref 4 KiB | O_DSYNC | 1,500 | 0.61 | 0.72 | 0.84 | 1.84 | 2.84 | 3.84 | - | - |" in lines
    assert "| 256 B | always | 100,000 | 2.10 | 47,593 | 11.6 | 1,443 | 0.3 |" in lines
    assert "| 256 B p99 ms <= 1 | 1.29 ms | 0.84 ms | 1.54x | **missed** |" in lines
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def catchup_doc() -> dict[str, Any]:
    def phase(seconds: float, count: int, p50: float, p99: float) -> dict[str, Any]:
        return {"seconds": seconds, "count": count, "latency_from_due_ms": _latency(p50, p99),
                "latency_ms": _latency(p50 - 0.1, p99 - 0.5)}

    def read(seconds: float, mib_per_s: float, cpu: float) -> dict[str, Any]:
        return {"block_bytes": 540 << 20, "seconds": seconds, "mib_per_s": mib_per_s, "payload_mib_per_s": mib_per_s,
                "consumer_cpu_ms_per_mib": cpu, "fetches": 512}

    idle = phase(30.0, 60_000, 0.72, 4.83)
    idle["windows_p99_ms"] = {"windows": 30, "window_s": 1.0, "median": 1.11, "min": 0.8, "max": 95.0}
    return {"bench": "catchup", "fsync": "always", "command": "stratalog bench catchup", **PROVENANCE,
            "object_store": "file:///x?y=1", "page_cache": "drop", "settings": {"cold_read_bytes_per_s_max": None},
            "produce": {"producers": 4, "rate_per_s": 2000.0, "idle": idle, "catchup": phase(1.0, 2000, 1.2, 9.53)},
            "catchup_read": read(1.02, 527.6, 0.51), "catchup_read_alone": read(0.7, 768.9, 0.5),
            "raw_ranged_get": {"get_bytes": 1 << 20,
                               "sequential": {"threads": 1, "seconds": 0.56, "mib_per_s": 962.1, "gets": 540},
                               "parallel": {"threads": 4, "seconds": 0.23, "mib_per_s": 2303.5, "gets": 540}},
            "targets": [_target("produce p99 catch-up / idle", 8.586, 1.5, at_least=False),
                        _target("catch-up / raw sequential gets", 0.548, 0.5, at_least=True)]}


def test_catchup_tables(tmp_path: Path) -> None:
    lines = _render(tmp_path, "catchup", [catchup_doc()])
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench catchup")
    assert "| A: idle | always | 30.0 | 60,000 | 0.72 | 4.83 | 7.83 | 0.62 | 4.33 | 7.33 |" in lines
    assert "| B: during catch-up | always | 1.0 | 2,000 | 1.20 | 9.53 | 12.53 | 1.10 | 9.03 | 12.03 |" in lines
    assert "| consumer: fetch(max_bytes=1 MiB), while producing | always | 1.02 | 527.6 | 527.6 | 0.51 | 512 |" in lines
    assert "| raw gets, parallel (4 threads) | - | 0.23 | 2,303.5 | - | - | 540 |" in lines
    assert "| produce p99 catch-up / idle | always | 8.59 | <= 1.5 | **missed** |" in lines
    assert "| catch-up / raw sequential gets | always | 0.55 | >= 0.5 | met |" in lines
    assert any("object store: file:///x, page cache: drop" in line for line in lines), "the URI's query is cut"


def streams_doc() -> dict[str, Any]:
    return {"bench": "streams", "command": "stratalog bench streams", **PROVENANCE, "streams": 1_000_000,
            "record_bytes": 58, "sampled_streams": 1000,
            "seconds": {"create_s": 9.2, "append_s": 33.2, "flush_s": 19.5, "read_sample_s": 0.21, "close_s": 1.0,
                        "reopen_s": 4.6},
            "streams_per_s": {"create": 108_695.6, "append": 30_120.5, "flush": 51_282.1, "reopen": 217_391.3},
            "rss_bytes": {"reopen_child_before": 30 << 20, "reopen_child_after": 348 << 20},
            "rss_bytes_per_stream": {"created": 512.4, "reopened": 333.4},
            "gc": {"full_collection_ms": 152.3, "tracked_objects": 1_030_000, "full_collection_after_freeze_ms": 0.04},
            "disk_bytes_per_stream_without_wal": 452.2, "reference": {"sqlite_insert_s": 2.0}}


def test_streams_tables(tmp_path: Path) -> None:
    lines = _render(tmp_path, "streams", [streams_doc()])
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench streams")
    assert "| create_streams (one commit) | 9.20 | 108,696 | 4.6x |" in lines
    assert "| append one record to each, all acknowledged | 33.20 | 30,120 | 16.6x |" in lines
    assert "| read back 1,000 streams | 0.21 | - | - |" in lines
    assert "| reference: the names as rows of a plain SQLite table | 2.00 | 500,000 | 1.0x |" in lines
    assert "| memory of a process that only opened the store, per stream | 333 B (318 MiB in all) |" in lines
    assert "| a full garbage collection with the store open | 152 ms (1,030,000 tracked objects) |" in lines


def _system(name: str, mode: str, send: float, index: float, consume: float) -> dict[str, Any]:
    return {"name": name, "mode": mode, "ok": True, "peak_rss_bytes": 2183 << 20, "disk_bytes": 7013 << 20,
            "phases": {"send": {"seconds": 70.6, "per_s": send}, "index_check": {"seconds": 13.5, "per_s": index},
                       "consume": {"seconds": 6.5, "per_s": consume}}}


def queues_docs() -> list[dict[str, Any]]:
    mine = _system("stratalog", "put", 1_417_017.4, 74_178.2, 3_058_404.0)
    mine["phases"]["index_check"].update(gets=1_000_000, object_reads=1_370_000)
    mine["phases"]["consume"].update(messages=20_000_000, object_reads=1_050_000)
    mine["reference"] = {"random_read_4k": {"per_s": 400_000.0}, "seq_write": {"mib_per_s": 3000.0},
                         "interpreter_put_loop": {"per_s": 3_420_000.0}}
    mine["ratios_to_disk"] = {"index_check": 0.185, "consume": 0.108, "send": 0.0274}
    mine["stats"] = {"queues": 1_000_000, "index_bytes": 104_000_000}
    mine["recovery"] = {"clean_open_seconds": 0.9, "open_after_kill9_seconds": 1.29, "objects": 7,
                        "index_bytes": 104 << 20, "messages_replayed": 1_000_000,
                        "flushed_round_missing_in_sampled_queues": 0}
    big = {"bench": "queues", "command": "stratalog bench queues", **PROVENANCE, "queues": 1_000_000,
           "messages": 100_000_000, "message_bytes": 58, "threads": 8, "batch": 0, "systems": [mine], "ratios": {}}
    small = {"bench": "queues", "command": "stratalog bench queues --queues 10000 --messages 1000000 --peers",
             **PROVENANCE, "queues": 10_000, "messages": 1_000_000, "message_bytes": 58, "threads": 8, "batch": 0,
             "systems": [_system("stratalog", "put", 2_103_548.0, 146_584.0, 5_452_105.0),
                         _system("lmdb", "put", 736_131.0, 95_883.0, 1_695_042.0),
                         {"name": "nats", "error": "the nats process died (exit code 1)"}],
             "ratios": {"send": {"fastest_peer": "lmdb", "ratio": 2.8576},
                        "index_check": {"fastest_peer": "lmdb", "ratio": 1.5288},
                        "consume": {"fastest_peer": "lmdb", "ratio": 3.2166}}}
    return [big, small]


def test_queues_tables_targets_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "queues.png"
    lines = _render(tmp_path, "queues", queues_docs(), "--plot", str(plot))
    assert lines[0] == "- " + PROVENANCE_LINE.format(command="stratalog bench queues").replace(
        " on 2 x AMD EPYC, 24 GiB, ext4 on /dev/vda", "")
    assert "All on 2 x AMD EPYC, 24 GiB, ext4 on /dev/vda." in lines, "one machine for both runs, said once"
    assert ("| 1 M x 100 M | stratalog | put | 70.6 | 1,417,017 | 13.5 | 74,178 | 6.5 | 3,058,404 | "
            "2,183 | 7,013 | yes |") in lines
    assert ("| 10 k x 1 M | lmdb | put | 70.6 | 736,131 | 13.5 | 95,883 | 6.5 | 1,695,042 | 2,183 | 7,013 "
            "| yes |") in lines
    assert ("| 10 k x 1 M | nats | - | - | - | - | - | - | - | - | - | "
            "**the nats process died (exit code 1)** |") in lines
    assert ("| 1 M x 100 M | put | 400,000 | 0.18x | 0.11x | 3,000 | 0.027x | 3,420,000 | 0.41x | 1.37 "
            "| 5.25 |") in lines
    assert ("| recovery after kill -9 reads indexes only and loses no flushed message (put run) | 1.29 s, 7 object "
            "indexes, 0 missing | met |") in lines
    assert "| send with put >= 1,100,000 msg/s | 1,417,017 (1.29x) | met |" in lines
    assert "| index check >= 100,000 get/s (put run) | 74,178 (0.74x) | **missed** |" in lines
    assert "| consume >= 3,000,000 msg/s (put run) | 3,058,404 (1.02x) | met |" in lines
    assert "| peak RSS < 4 GiB (put run) | 2,183 MiB | met |" in lines
    assert ("| each phase >= 3x the fastest peer (10 k x 1 M, put) | send 2.86x (lmdb), index check 1.53x "
            "(lmdb), consume 3.22x (lmdb) | **missed** |") in lines
    # The small run is for the peers: the race's absolute bars are not applied to it.
    assert not any("2,103,548 (" in line for line in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _peer(name: str, p99_256: float, msg_per_s_100: float, tail_mb_per_s_1k: float) -> dict[str, Any]:
    def rates(msg_per_s: float, size: int) -> dict[str, Any]:
        return {"messages": 200_000, "msg_per_s": msg_per_s, "mb_per_s": msg_per_s * size / 1e6, "ok": True}

    cold: dict[str, Any] = {"not_applicable": "no objects"} if name == "tansu" else rates(msg_per_s_100 / 2, 100)
    return {"name": name, "status": "ran",
            "latency": [{"message_bytes": 256, "produce_ms": _latency(p99_256 / 2, p99_256),
                         "end_to_end_ms": _latency(p99_256 / 2 + 0.2, p99_256 + 0.2)}],
            "throughput": [{"message_bytes": 100, "produce": rates(msg_per_s_100, 100),
                            "consume_tail": rates(msg_per_s_100, 100), "consume_cold": cold,
                            "tail_run": {"is_produce_run": True, "messages": 200_000}},
                           {"message_bytes": 1024, "produce": rates(msg_per_s_100 / 5, 1024),
                            "consume_tail": rates(tail_mb_per_s_1k * 1e6 / 1024, 1024), "consume_cold": cold,
                            "tail_run": {"is_produce_run": False, "messages": 32_768}}]}


def kafka_doc() -> dict[str, Any]:
    return {"bench": "kafka", "command": "stratalog bench kafka", **PROVENANCE,
            "settings": {"rate_per_s": 50.0, "duration_s": 30.0, "producers": 2, "linger_ms": 5,
                         "batch_bytes": 1 << 20},
            "disk_reference": {"name": "disk (4 KiB O_DIRECT+O_DSYNC write)", "produce_ms": _latency(0.39, 0.8)},
            "peers": [_peer("stratalog", 3.33, 1_260_712.0, 373.7), _peer("nats", 1.86, 5194.0, 131.5),
                      _peer("tansu", 2.58, 1_242_225.0, 554.4)]}


def test_kafka_tables(tmp_path: Path) -> None:
    lines = _render(tmp_path, "kafka", [kafka_doc()])
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench kafka")
    assert ("| disk (4 KiB O_DIRECT+O_DSYNC write) | 4 KiB | 1,500 | 0.39 | 0.59 | 0.80 | 1.80 | 3.80 | 1.00x | - "
            "| - |") in lines
    assert "| stratalog | 256 B | 1,500 | 1.67 | 2.50 | 3.33 | 4.33 | 6.33 | 4.16x | 1.86 | 3.53 |" in lines
    assert ("| stratalog | 100 B | 200,000 | 1,260,712 | 126.1 | 200,000 | 1,260,712 | 126.1 | 630,356 | 63.0 |  |"
            in lines)
    assert ("| tansu | 1 KiB | 200,000 | 248,445 | 254.4 | 200,000 | 541,406 | 554.4 | n/a | n/a | tail run: a topic "
            "of its own (32,768 messages) |") in lines
    assert "| produce p99 <= 1.5 ms at 256 B, fsync always | 3.33 ms; the disk's own p99 in the same run: 0.80 ms " \
           "| **missed** |" in lines
    assert "| 100 B produce msg/s >= 3x NATS JetStream | 242.72x (stratalog 1,260,712 vs 5,194 msg/s) | met |" in lines
    assert ("| tail consume MB/s (1 KiB) within 0.5x of Tansu (no disk) | 0.67x (stratalog 374 vs 554 MB/s) "
            "| met |") in lines


def abuse_doc() -> dict[str, Any]:
    def phase(name: str, connections: int, p99: float, rss: float) -> dict[str, Any]:
        p: dict[str, Any] = {"name": name, "connections": connections, "families": [name] if connections else [],
                             "produce_ms": _latency(1.0, p99), "p99_over_baseline": p99 / 2.08,
                             "broker_rss_mib_peak": rss, "broker_sockets_peak": 4 + connections,
                             "broker_log_lines": 7, "broker_up": True, "error_count": 0, "aborted": False}
        if connections:
            p["hostile"] = {"ramp": {"connected": connections},
                            "report": {"cpu_s": 0.7, "families": {name: {
                                "opened": connections, "actions": 6684, "closed_by_broker": 0, "not_closed": 0,
                                "connect_errors": 0, "held_s_max": None, "first_error": ""}}}}
        return p

    return {"bench": "abuse", "command": "stratalog bench abuse", **PROVENANCE,
            "settings": {"record_bytes": 256, "rate_per_s": 200.0, "phase_s": 20.0, "connections": 1000,
                         "memory_budget_mib": 1024},
            "phases": [phase("baseline", 0, 2.08, 102.0), phase("slowloris", 1000, 3.61, 105.0),
                       phase("pipeline", 1000, 440.64, 127.0)]}


def test_abuse_tables(tmp_path: Path) -> None:
    lines = _render(tmp_path, "abuse", [abuse_doc()])
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench abuse")
    assert "| baseline | 0 | 1,500 | 1.00 | 2.08 | 3.08 | 5.08 | 1.00x | 102 | 4 | 7 | yes |" in lines
    assert "| slowloris | 1,000 of 1,000 | 1,500 | 1.00 | 3.61 | 4.61 | 6.61 | 1.74x | 105 | 1,004 | 7 | yes |" in lines
    assert "| slowloris: p99 <= 2x the baseline's | 1.74x (3.61 ms against 2.08) | met |" in lines
    assert "| pipeline: p99 <= 2x the baseline's | 211.85x (440.64 ms against 2.08) | **missed** |" in lines
    assert "| broker RSS <= 1,024 MiB in every phase | 127 MiB at the peak (pipeline) | met |" in lines


def wal_objects_doc() -> dict[str, Any]:
    def phase(per_s: float, p50: float, p99: float) -> dict[str, Any]:
        return {"records": int(per_s * 3), "seconds": 3.0, "records_per_s": per_s, "mib_per_s": per_s * 4096 / 2**20,
                "latency_ms": _latency(p50, p99), "trims": 6}

    return {"benchmark": "wal-objects", "command": "stratalog bench wal-objects", **PROVENANCE, "record_bytes": 4096,
            "seconds_per_phase": 3.0, "outstanding_max": 1024,
            "object_wal_config": {"linger_s": 0.005, "object_bytes_soft_max": 4 << 20, "puts_in_flight_max": 8},
            "targets": [{"target": "device WAL (file, fsync always)", "serial": phase(787.2, 0.17, 14.13),
                         "flat_out": phase(50_935.4, 15.19, 65.36)},
                        {"target": "object WAL, local directory", "serial": phase(81.0, 10.29, 33.72),
                         "flat_out": phase(30_655.0, 26.22, 67.84)}]}


def test_wal_objects_table(tmp_path: Path) -> None:
    lines = _render(tmp_path, "wal-objects", [wal_objects_doc()])
    assert lines[0] == PROVENANCE_LINE.format(command="stratalog bench wal-objects")
    assert ("4,096 B records, 3 s a phase (serial: one append at a time; flat out: 1,024 in flight); object WAL: "
            "linger 5 ms, 8 puts in flight.") in lines
    assert "| device WAL (file, fsync always) | serial | 787 | 3.1 | 0.17 | 14.13 | 17.13 |" in lines
    assert "| device WAL (file, fsync always) | flat out | 50,935 | 199.0 | 15.19 | 65.36 | 68.36 |" in lines
    assert "| object WAL, local directory | serial | 81 | 0.3 | 10.29 | 33.72 | 36.72 |" in lines
