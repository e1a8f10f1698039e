"""`stratalog bench spark`: the command-line shell around :mod:`stratalog.bench.spark`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from stratalog.bench.common import write_json
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar, table, verdict

RECORDS_DEFAULT = 2_000_000
RECORDS_QUICK = 200_000
PHASES = 11


@click.command()
@click.option("--records", type=click.IntRange(1), default=None,
              help=f"Records written and read (default {RECORDS_DEFAULT:,}; --quick {RECORDS_QUICK:,}).")
@click.option("--streams", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--value-bytes", type=click.IntRange(20), default=100, show_default=True)
@click.option("--master", default="local[*]", show_default=True)
@click.option("--driver-memory", default="4g", show_default=True,
              help="Spark's driver (and, locally, executor) heap: 1 KiB rows cached and written need more than "
                   "Spark's 1g.")
@click.option("--quick", is_flag=True, help="A short run to check the set-up.")
@click.option("--broker/--no-broker", default=True, show_default=True,
              help="Also write, read, materialize and stream through a live broker (stratalog serve).")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Work directory (default: a temporary one under the current directory).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--markdown-from", "markdown_from", multiple=True, metavar="JSON",
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Run nothing: print the Markdown tables of BENCHMARKS.md from these runs' JSON (repeatable).")
def spark(records: int | None, streams: int, value_bytes: int, master: str, driver_memory: str, quick: bool,
          broker: bool, dir_path: Path | None, json_path: Path | None, markdown_from: tuple[Path, ...]) -> None:
    """Read and write N records through the data source vs Spark's Parquet, and compaction MB/s; with a
    live broker, writes, reads, materialized reads and a streaming query's latency too."""
    if markdown_from:
        click.echo(markdown([json.loads(p.read_text()) for p in markdown_from]))
        return
    from stratalog.bench.spark import SparkBenchPlan, run_spark_bench
    from stratalog.spark import local_session

    console = make_console()
    plan = SparkBenchPlan(records or (RECORDS_QUICK if quick else RECORDS_DEFAULT), streams, value_bytes, master,
                          broker)
    with bench_dir(dir_path) as work:
        machine = print_machine(console, work)
        session = local_session(master, app_name="stratalog-bench",
                                extra_conf={"spark.driver.memory": driver_memory})
        session.sparkContext.setLogLevel("ERROR")
        try:
            with progress_bar(console, PHASES) as bar:
                doc = run_spark_bench(session, plan, work, bar.phase)
        finally:
            session.stop()
    doc["machine"] = machine
    _report(console, doc)
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"wrote {json_path}")


def _report(console: Any, doc: dict[str, Any]) -> None:
    p = doc["plan"]
    out = table(f"Spark {p['master']}: {p['records']:,} records of {p['value_bytes']} B over {p['streams']:,} "
                "streams; Parquet is Spark's own, in the same run", ("step", "seconds", "rows/s",
                "Parquet s", "Parquet rows/s", "ratio", "target", "verdict"), left=("step", "target", "verdict"))
    steps = [("write (at rest)", doc["write"]), ("read (at rest)", doc["read"])]
    b = doc.get("broker")
    if b:
        steps += [("write (broker)", b["write"]), ("read (broker)", b["read"]),
                  ("read (materialized)", b["materialized_read"])]
    for name, r in steps:
        out.add_row(name, f"{r['seconds']:.2f}", f"{r['rows_per_s']:,.0f}", f"{r['parquet_seconds']:.2f}",
                    f"{r['parquet_rows_per_s']:,.0f}", f"{r['ratio']:.2f}", f">= {r['target']['bound']:g}",
                    verdict(r["target"]))
    console.print(out)
    if b:
        m, lat = b["materialize"], b["latency"]
        console.print(f"materialize: {m['files']} files, {m['bytes'] / 1e6:.1f} MB in {m['seconds']:.2f} s "
                      f"({m['rows_per_s']:,.0f} rows/s)")
        console.print(f"acknowledgement -> streaming output ({lat['trigger']} trigger, {lat['seen']:,} of "
                      f"{lat['records']:,} records): p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, "
                      f"max {lat['max_ms']:.0f} ms")
    c = doc["compact"]
    console.print(f"compaction: {c['objects_replaced']} objects -> {c['objects_written']} per-stream objects, "
                  f"{c['bytes_written'] / 1e6:.1f} MB in {c['seconds']:.2f} s = {c['mb_per_s']:.1f} MB/s")


def markdown(docs: list[dict[str, Any]]) -> str:
    """BENCHMARKS.md's tables for these runs: each step against Parquet, then materialization and latency."""
    lines = ["| records | value | step | seconds | rows/s | Parquet rows/s | ratio | target |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    extra = ["| records | value | materialize | ack -> streaming output, 1 s trigger: p50 / p99 / max |",
             "|---:|---:|---|---|"]
    for doc in docs:
        p, b = doc["plan"], doc.get("broker")
        steps = [("write, at rest", doc["write"]), ("read, at rest", doc["read"])]
        if b:
            steps += [("write, broker", b["write"]), ("read, broker", b["read"]),
                      ("read, materialized", b["materialized_read"])]
        for name, r in steps:
            t = r["target"]
            lines.append(f"| {p['records']:,} | {p['value_bytes']} B | {name} | {r['seconds']:.2f} | "
                         f"{r['rows_per_s']:,.0f} | {r['parquet_rows_per_s']:,.0f} | {r['ratio']:.2f} | "
                         f">= {t['bound']:g}: {'met' if t['met'] else 'missed'} |")
        if b:
            m, lat = b["materialize"], b["latency"]
            extra.append(f"| {p['records']:,} | {p['value_bytes']} B | {m['files']} files, "
                         f"{m['bytes'] / 1e6:,.0f} MB in {m['seconds']:.1f} s | {lat['p50_ms']:.0f} / "
                         f"{lat['p99_ms']:.0f} / {lat['max_ms']:.0f} ms ({lat['seen']:,} records) |")
    return "\n".join([*lines, "", *extra])
