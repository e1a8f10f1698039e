"""`stratalog bench abuse`: the command-line shell around :mod:`stratalog.bench.abuse`."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from stratalog.bench.abuse_hostile import FAMILIES
from stratalog.bench.abuse_report import FAMILY_HEADS, PHASE_HEADS, family_rows, markdown_report, phase_cells, targets
from stratalog.bench.common import Activity, write_json
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar, table

CONNECTIONS_DEFAULT = 1_000
PHASE_S_DEFAULT = 20.0
#: 200 records a second for 20 s: 4,000 samples a phase, enough for a p99.9 of a few samples' worth.
RATE_PER_S_DEFAULT = 200.0
RECORD_BYTES_DEFAULT = 256
REPEAT_INTERVAL_S_DEFAULT = 1.0
#: "A byte every few seconds": well inside the broker's request_read_timeout_ms (60 s).
SLOWLORIS_BYTE_INTERVAL_S_DEFAULT = 3.0
#: What each slowloris frame claims: 1 MiB, under request_bytes_max (100 MiB), so the broker waits for it.
SLOWLORIS_CLAIM_BYTES = 1 << 20
PIPELINE_REQUESTS_MAX_DEFAULT = 1_000
FETCH_TOPIC_BYTES_DEFAULT = 1 << 20
RAMP_S_MAX_DEFAULT = 30.0
MEMORY_BUDGET_MIB_DEFAULT = 1_024
#: The machine's safety: a phase stops once the broker holds this much (it has 24 GiB here).
RSS_ABORT_MIB_DEFAULT = 4_096


def _phase_table(doc: dict[str, Any]) -> Any:
    s = doc["settings"]
    out = table(f"Produce latency (ms) of one producer, {s['record_bytes']} B one at a time at {s['rate_per_s']:g}/s, "
                f"acks=all, {s['phase_s']:g} s per phase, beside {s['connections']:,} hostile connections",
                PHASE_HEADS, left=("phase", "up"))
    for p in doc["phases"]:
        cells = phase_cells(p)
        cells[-1] = "[green]yes[/]" if p["broker_up"] else "[red]no[/]"
        if p["aborted"] or p["error_count"]:
            cells[0] += f" [red]({p['aborted'] or str(p['error_count']) + ' errors: ' + p['errors'][0]})[/]"
        out.add_row(*cells)
    return out


def _report(console: Console, doc: dict[str, Any]) -> None:
    console.print(_phase_table(doc))
    families = table("What the hostile process did", FAMILY_HEADS, left=("family", "first error"))
    for row in family_rows(doc):
        families.add_row(*row)
    console.print(families)
    b = doc["broker"]
    console.print(f"broker: {b['rss_mib_before']:,.0f} MiB resident before the phases, {b['rss_mib_hwm']:,.0f} MiB "
                  f"at its high-water mark (VmHWM); {'alive' if b['alive_at_end'] else '[red]gone[/]'} at the end")
    load, other = doc["load_average_1m"], doc["other_activity"]
    console.print(f"while it ran, other processes used {other['other_cpu_s']:,.1f} CPU-s (the broker's and the "
                  f"hostile processes' taken out), the hypervisor stole {other['steal_cpu_s']:,.1f} CPU-s; load "
                  f"average (1 min) {load['start']:.2f} at start, {load['end']:.2f} at end")
    for t in targets(doc):
        verdict = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"target {t['name']}: {t['figure_text']}: {verdict}")


def _families(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown or not names:
        raise click.BadParameter(f"unknown families {', '.join(unknown)}; known: {', '.join(FAMILIES)}",
                                 param_hint="--families")
    return names


@click.command(name="abuse")
@click.option("--connections", type=click.IntRange(1, 10_000), default=CONNECTIONS_DEFAULT, show_default=True,
              help="Hostile connections in each abuse phase.")
@click.option("--families", default=",".join(FAMILIES), show_default=True,
              help="Comma-separated families of abuse, each a phase; then all of them at once.")
@click.option("--phase-s", type=click.FloatRange(min=0, min_open=True), default=PHASE_S_DEFAULT, show_default=True,
              help="Seconds the producer is measured in each phase.")
@click.option("--rate", "rate_per_s", type=click.FloatRange(min=0, min_open=True), default=RATE_PER_S_DEFAULT,
              show_default=True, help="Records per second of the well-behaved producer (one at a time).")
@click.option("--record-bytes", type=click.IntRange(1, 1 << 20), default=RECORD_BYTES_DEFAULT, show_default=True,
              help="Size of each of its records.")
@click.option("--repeat-interval-s", type=click.FloatRange(min=0.01), default=REPEAT_INTERVAL_S_DEFAULT,
              show_default=True, help="Each looping hostile connection (oversize, garbage, fetch_all, churn) acts "
                                      "once this often.")
@click.option("--slowloris-byte-interval-s", type=click.FloatRange(min=0.01),
              default=SLOWLORIS_BYTE_INTERVAL_S_DEFAULT, show_default=True,
              help="A slowloris connection sends one more byte of its frame this often.")
@click.option("--pipeline-requests", "pipeline_requests_max", type=click.IntRange(1, 100_000),
              default=PIPELINE_REQUESTS_MAX_DEFAULT, show_default=True,
              help="Requests each pipelining connection sends without reading a response.")
@click.option("--fetch-topic-bytes", type=click.IntRange(1 << 10, 1 << 30), default=FETCH_TOPIC_BYTES_DEFAULT,
              show_default=True, help="Bytes in the topic the fetch_all family asks for everything of.")
@click.option("--ramp-s", "ramp_s_max", type=click.FloatRange(min=1), default=RAMP_S_MAX_DEFAULT, show_default=True,
              help="The longest the hostile process may take to open its connections before a phase starts.")
@click.option("--memory-budget-mib", type=click.IntRange(min=1), default=MEMORY_BUDGET_MIB_DEFAULT,
              show_default=True, help="The target: the broker's peak resident memory in every phase.")
@click.option("--rss-abort-mib", type=click.IntRange(min=1), default=RSS_ABORT_MIB_DEFAULT, show_default=True,
              help="A phase is cut short once the broker's resident memory passes this.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the broker keeps its data [default: a temporary directory under the current one].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write every figure as JSON here.")
@click.option("--markdown-from", "--report", "report_path", metavar="JSON", default=None,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Measure nothing: print this run's tables (from --json) as Markdown.")
def abuse(connections: int, families: str, phase_s: float, rate_per_s: float, record_bytes: int,
          repeat_interval_s: float, slowloris_byte_interval_s: float, pipeline_requests_max: int,
          fetch_topic_bytes: int, ramp_s_max: float, memory_budget_mib: int, rss_abort_mib: int,
          data_dir: Path | None, json_path: Path | None, report_path: Path | None) -> None:
    """A well-behaved producer's latency while hostile connections abuse the broker.

    Starts `stratalog serve` on 127.0.0.1 (default settings), then measures one producer (confluent-kafka,
    acks=all, one record at a time at --rate) for --phase-s with no abuse, then beside --connections
    hostile connections of each family in turn, opened by a separate process: slowloris (half a frame,
    then a byte every few seconds), idle, oversize (frames claiming 2 GiB), garbage frames, pipelining
    without reading, fetch_all (every byte limit at its maximum, the longest wait) and churn (connect and
    close); then all families at once; then with no abuse again. Each phase: the producer's p50/p99/p99.9,
    its p99 over the first baseline's, the broker's peak resident memory and sockets, and whether it still
    answers.
    """
    from stratalog.bench.abuse import ACK_WAIT_S, AbuseBenchPlan, run_abuse_bench

    if report_path is not None:
        click.echo(markdown_report(json.loads(report_path.read_text())), nl=False)
        return
    console = make_console()
    with bench_dir(data_dir) as target_dir:
        plan = AbuseBenchPlan(connections=connections, families=_families(families), phase_s=phase_s,
                              rate_per_s=rate_per_s, record_bytes=record_bytes, repeat_interval_s=repeat_interval_s,
                              slowloris_byte_interval_s=slowloris_byte_interval_s,
                              slowloris_claim_bytes=SLOWLORIS_CLAIM_BYTES, pipeline_requests_max=pipeline_requests_max,
                              fetch_topic_bytes=fetch_topic_bytes, ramp_s_max=ramp_s_max,
                              memory_budget_mib=memory_budget_mib, rss_abort_mib=rss_abort_mib, data_dir=target_dir)
        machine = print_machine(console, target_dir)
        load_start, activity_start = os.getloadavg()[0], Activity.take(machine["disk_device"])
        with progress_bar(console, len(plan.phases()) + 1) as bar:
            measured = run_abuse_bench(plan, bar)
        other = Activity.take(machine["disk_device"]).others_since(activity_start)
    # The broker and the hostile processes are this run's, not others': their CPU time is taken out.
    ours_s = (measured["broker"].get("cpu_s") or 0.0) + sum(
        p.get("hostile", {}).get("report", {}).get("cpu_s", 0.0) for p in measured["phases"])
    other["other_cpu_s"] = max(0.0, other["other_cpu_s"] - ours_s)
    doc: dict[str, Any] = {
        "bench": "abuse", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "settings": {"connections": connections, "families": list(plan.families), "phase_s": phase_s,
                     "rate_per_s": rate_per_s, "record_bytes": record_bytes, "acks": "all", "linger_ms": 0,
                     "repeat_interval_s": repeat_interval_s, "slowloris_byte_interval_s": slowloris_byte_interval_s,
                     "slowloris_claim_bytes": SLOWLORIS_CLAIM_BYTES, "pipeline_requests_max": pipeline_requests_max,
                     "fetch_topic_bytes": fetch_topic_bytes, "ramp_s_max": ramp_s_max,
                     "memory_budget_mib": memory_budget_mib, "rss_abort_mib": rss_abort_mib, "ack_wait_s": ACK_WAIT_S,
                     "percentiles": "numpy, exact over every sample"},
        **measured,
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]}, "other_activity": other,
    }
    doc["targets"] = targets(doc)
    _report(console, doc)
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
