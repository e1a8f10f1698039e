"""`stratalog bench kafka`: the command-line shell around :mod:`stratalog.bench.kafka`."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from stratalog.bench.common import Activity, size_label, write_json
from stratalog.bench.cpu_split import CpuSplit, CpuSplitError, parse_cpu_list
from stratalog.bench.kafka import (
    DISK_REFERENCE_NAME,
    LATENCY_SIZES_BYTES_DEFAULT,
    LINGER_MS,
    PEERS,
    RATE_PER_S_DEFAULT,
    THROUGHPUT_SIZES_BYTES,
    KafkaBenchPlan,
    ratios,
)
from stratalog.bench.kafka_report import (
    consumer_text,
    markdown_report,
    recompressed_row,
    targets,
    throughput_notes,
    transactional_table,
)
from stratalog.bench.log_report import ms
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar, table
from stratalog.commands.bench_wal import parse_sizes

DURATION_S_DEFAULT = 30.0
#: NATS with sync_interval always takes a few thousand acknowledged publishes a second on one disk: 200,000
#: keep its two throughput sizes near a minute each.
MESSAGES_DEFAULT = 200_000
PRODUCERS_DEFAULT = 2
#: The largest latency size offered: the broker's message_bytes_max is 8 MiB, less room for the batch.
LATENCY_SIZE_BYTES_MAX = 4 << 20
CLIENTS_NOTE = ("clients: confluent-kafka (librdkafka, the fastest Kafka client for Python) for stratalog and "
                "tansu; nats-py for NATS")


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _skipped_row(out: Table, peer: dict[str, Any], columns: int) -> None:
    out.add_row(peer["name"], "-", *["-"] * (columns - 3), f"[yellow]skipped: {peer['reason']}[/]")


def _latency_table(doc: dict[str, Any], kind: str, title: str) -> Table:
    columns = ("peer", "size", "count", "p0", "p50", "p90", "p99", "p99.9", "p99.99", "p99.9999", "max", "note")
    out = table(title, columns, left=("peer", "size", "note"))
    disk = doc.get("disk_reference", {})
    if kind == "produce_ms" and disk:
        if "error" in disk:
            out.add_row(disk["name"], "4 KiB", "-", *["-"] * 8, f"[red]{disk['error']}[/]")
        else:
            lat = disk["produce_ms"]
            out.add_row(disk["name"], "4 KiB", f"{lat['samples']:,}",
                        *(ms(lat[k]) for k in ("p0", "p50", "p90", "p99", "p99_9", "p99_99", "p99_9999", "max")),
                        "the bare disk, same rate")
    for peer in doc["peers"]:
        if peer["status"] == "skipped":
            _skipped_row(out, peer, len(columns))
            continue
        for r in peer["latency"]:
            lat = r.get(kind, {})
            if "error" in r or not lat.get("samples"):
                out.add_row(peer["name"], size_label(r["message_bytes"]), "-", *["-"] * 8,
                            f"[red]{r.get('error') or '; '.join(r.get('errors', [])) or 'no samples'}[/]")
                continue
            note = f"[red]{r['error_count']} errors: {r['errors'][0]}[/]" if r["error_count"] else ""
            out.add_row(peer["name"], size_label(r["message_bytes"]), f"{lat['samples']:,}",
                        *(ms(lat[k]) for k in ("p0", "p50", "p90", "p99", "p99_9", "p99_99", "p99_9999", "max")),
                        note)
    return out


def _rate_cells(d: dict[str, Any]) -> tuple[str, str]:
    if "msg_per_s" not in d:
        return "-", "-"
    return f"{d['msg_per_s']:,.0f}", f"{d['mb_per_s']:,.1f}"


def _throughput_table(doc: dict[str, Any]) -> Table:
    s = doc["settings"]
    columns = ("peer", "size", "messages", "produce msg/s", "produce MB/s", "tail msgs", "tail msg/s", "tail MB/s",
               "cold msg/s", "cold MB/s", "note")
    out = table(f"Throughput: {s['producers']} producer processes, acks=all, linger.ms={s['linger_ms']}, "
                f"batch.size {s['batch_bytes'] >> 20} MiB (NATS: publish_async, 4,000 in flight); one consumer "
                f"reads a tail run back at once (tail), then again once uploaded (cold). {consumer_text(doc)} "
                "(MB = 10^6 bytes)",
                columns, left=("peer", "size", "note"))
    for peer in doc["peers"]:
        if peer["status"] == "skipped":
            _skipped_row(out, peer, len(columns))
            continue
        for r in peer["throughput"]:
            p, t, c = r.get("produce", {}), r.get("consume_tail", {}), r.get("consume_cold", {})
            out.add_row(peer["name"], size_label(r["message_bytes"]), f"{p.get('messages', 0):,}", *_rate_cells(p),
                        f"{t.get('messages', 0):,}", *_rate_cells(t),
                        *(("n/a", "n/a") if "not_applicable" in c else _rate_cells(c)),
                        "; ".join(throughput_notes(r)))
            if (extra := recompressed_row(peer["name"], r)) is not None:
                out.add_row(*extra)
    return out


def _ratios_table(doc: dict[str, Any]) -> Table:
    pairs = list(doc["ratios"])
    out = table("stratalog over each peer: latency below 1x and throughput above 1x mean stratalog is faster",
                ("figure", *pairs), left=("figure",))
    keys = list(dict.fromkeys(k for pair in pairs for k in doc["ratios"][pair]))
    for key in keys:
        out.add_row(key, *(f"{doc['ratios'][pair][key]:.2f}x" if key in doc["ratios"][pair] else "-"
                           for pair in pairs))
    return out


def _report(console: Console, doc: dict[str, Any]) -> None:
    s = doc["settings"]
    for peer in doc["peers"]:
        server = peer.get("server")
        if server:
            console.print(f"{peer['name']}: {server['version']}, {server['durability']}; {peer['client']}")
    console.print(CLIENTS_NOTE)
    load = f"one producer at {s['rate_per_s']:g} msg/s for {s['duration_s']:g} s, acks=all, linger.ms=0"
    load += f"; {DISK_REFERENCE_NAME}: the same rate on the bare disk"
    console.print(_latency_table(doc, "produce_ms", f"Produce latency (ms), {load}; from send to acknowledgement"))
    console.print(_latency_table(doc, "end_to_end_ms", f"End-to-end latency (ms), {load}; from send to a consumer "
                                                       "beside the producer receiving it"))
    console.print(_throughput_table(doc))
    if (txn := transactional_table(doc)).rows:
        console.print(txn.rich())
    if doc["ratios"]:
        console.print(_ratios_table(doc))
    for t in doc["targets"]:
        verdict = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"target {t['name']}: {t['figure_text']}: {verdict}")


@click.command(name="kafka")
@click.option("--only", default=",".join(PEERS), show_default=True, help="Comma-separated peers to run.")
@click.option("--sizes", default=",".join(size_label(s).replace(" ", "") for s in LATENCY_SIZES_BYTES_DEFAULT),
              show_default=True, help="Latency message sizes.")
@click.option("--duration-s", type=click.FloatRange(min=0, min_open=True), default=DURATION_S_DEFAULT,
              show_default=True, help="Seconds of latency load per size.")
@click.option("--rate", "rate_per_s", type=click.FloatRange(min=0, min_open=True), default=RATE_PER_S_DEFAULT,
              show_default=True, help="Messages per second of the latency load.")
@click.option("--messages", type=click.IntRange(min=1), default=MESSAGES_DEFAULT, show_default=True,
              help="Messages per throughput size (100 B and 1 KiB), over all producers.")
@click.option("--nats-messages", type=click.IntRange(min=1), default=None,
              help="NATS's messages per throughput size [default: --messages]: NATS syncs each publish, about "
                   "5,000 a second here, so give it fewer when --messages runs to millions.")
@click.option("--producers", type=click.IntRange(1, 64), default=PRODUCERS_DEFAULT, show_default=True,
              help="Throughput producer processes.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the servers keep their data [default: a temporary directory under the current one].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write every figure as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also plot produce latency by percentile as a PNG here (needs matplotlib).")
@click.option("--broker-config", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="A --config file for stratalog serve (default: its defaults), e.g. validate_records = false "
                   "to measure what checking every produced record costs.")
@click.option("--server-cpus", metavar="LIST", default=None,
              help="Run each server on these vCPUs (taskset's list form: 0, 0,2, 0-1) and every client process "
                   "(producers, consumers) on the others, in every phase [default: all share every vCPU]. On a "
                   "machine of few vCPUs the clients otherwise take part of the server's CPU, and not all alike: "
                   "librdkafka's idempotent and transactional producers poll without sleeping while their one "
                   "produce request per partition is in flight, the plain one does not. Split, the server has its "
                   "vCPUs to itself in every phase, and the clients share theirs.")
@click.option("--markdown-from", "--report", "report_path", metavar="JSON", default=None,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Measure nothing: print this run's tables (from --json) as Markdown.")
def kafka(only: str, sizes: str, duration_s: float, rate_per_s: float, messages: int, nats_messages: int | None,
          producers: int, data_dir: Path | None, json_path: Path | None, plot_path: Path | None,
          broker_config: Path | None, server_cpus: str | None, report_path: Path | None) -> None:
    """stratalog serve beside NATS JetStream and Tansu: latency and throughput.

    Latency is measured as "Building a Distributed Log from Scratch, Part 1" measures it.

    Each peer's server starts here on 127.0.0.1 (data on the same disk, under --data-dir) and is stopped
    before the next starts. Latency: one producer sends each size at --rate for --duration-s, acks=all,
    linger.ms=0; percentiles of produce latency and of end-to-end latency to a consumer beside it.
    Throughput: --producers processes send --messages of 100 B and of 1 KiB with librdkafka's batching,
    every message acknowledged. A consumer reads a tail run (at most half stratalog's upload threshold)
    back at once, from the tail, and again once stratalog has uploaded it, from objects (NATS: after the
    same wait; Tansu has no objects). stratalog also takes each size's messages into a topic of
    compression.type=zstd, so that it recompresses every batch: the rate shows what that costs; and in
    transactions committed every 100 ms (and, for reference, idempotent without transactions), whose
    tail it reads back with isolation.level read_uncommitted and read_committed.
    stratalog syncs before it acknowledges, NATS is set to (sync_interval: always), Tansu keeps
    everything in memory. Before the peers, the bare disk under --data-dir takes one 4 KiB O_DIRECT +
    O_DSYNC write per message at --rate for --duration-s. With --server-cpus, each server runs on vCPUs
    of its own and every client on the others.
    """
    from stratalog.bench.kafka import plot_latency, run_kafka_bench

    if report_path is not None:
        click.echo(markdown_report(json.loads(report_path.read_text())), nl=False)
        return
    names = tuple(n.strip() for n in only.split(",") if n.strip())
    unknown = sorted(set(names) - set(PEERS))
    if unknown or not names:
        raise click.BadParameter(f"unknown peers {', '.join(unknown)}; known: {', '.join(PEERS)}",
                                 param_hint="--only")
    try:
        split = CpuSplit.of(parse_cpu_list(server_cpus)) if server_cpus is not None else None
    except CpuSplitError as e:
        raise click.BadParameter(str(e), param_hint="--server-cpus") from None
    console = make_console()
    with bench_dir(data_dir) as target_dir:
        plan = KafkaBenchPlan(peers=names, latency_sizes_bytes=parse_sizes(sizes, LATENCY_SIZE_BYTES_MAX),
                              duration_s=duration_s, rate_per_s=rate_per_s,
                              throughput_sizes_bytes=THROUGHPUT_SIZES_BYTES, messages=messages,
                              producers=producers, data_dir=target_dir, broker_config=broker_config,
                              nats_messages=nats_messages, cpu_split=split)
        machine = print_machine(console, target_dir)
        # The report's first line says when the machine was busy at the start, and how much else ran
        # meanwhile (its figures then say more about the machine than about the code).
        load_start, activity_start, children_start_s = os.getloadavg()[0], Activity.take(machine["disk_device"]), \
            _children_cpu_s()
        with progress_bar(console, plan.phases) as bar:
            measured = run_kafka_bench(plan, bar)
        other = Activity.take(machine["disk_device"]).others_since(activity_start)
    peers, disk = measured["peers"], measured["disk_reference"]
    doc: dict[str, Any] = {
        "bench": "kafka", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine, "clients": CLIENTS_NOTE,
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
        # The servers and producer processes are this run's own: children, all reaped by now (their disk
        # writes are then in this process's counters already, their CPU time in its children's).
        "other_activity": {**other, "other_cpu_s": max(0.0, other["other_cpu_s"] - (_children_cpu_s() -
                                                                                    children_start_s))},
        "settings": {"rate_per_s": rate_per_s, "duration_s": duration_s,
                     "latency_sizes_bytes": list(plan.latency_sizes_bytes), "acks": "all",
                     "latency_linger_ms": 0, "throughput_sizes_bytes": list(plan.throughput_sizes_bytes),
                     "messages": messages, "nats_messages": nats_messages, "producers": producers,
                     "linger_ms": LINGER_MS,
                     "broker_config": broker_config.read_text() if broker_config else None,
                     "batch_bytes": 1 << 20, "percentiles": "numpy, exact over every sample",
                     "cpu_split": split.describe() if split is not None else None,
                     "tail_messages": {str(size): plan.tail_messages(size) for size in plan.throughput_sizes_bytes}},
        "disk_reference": disk, "peers": peers, "ratios": ratios(peers, disk),
    }
    doc["targets"] = targets(doc)
    _report(console, doc)
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
    if plot_path is not None:
        try:
            plot_latency(peers, plot_path, f"Produce latency by percentile: acks=all, one producer at "
                                           f"{rate_per_s:g} msg/s for {duration_s:g} s ({machine['cpus']} CPUs, "
                                           f"{machine['filesystem']})", disk)
            console.print(f"plot written to {plot_path}")
        except ImportError as e:
            console.print(f"[red]no plot: {e} (pip install 'stratalog[bench]')[/]")
