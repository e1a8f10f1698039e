"""`stratalog bench spark`: the command-line shell around :mod:`stratalog.bench.spark`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from stratalog.bench.common import write_json
from stratalog.bench.tables import markdown_table, provenance_lines
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar, table, verdict

RECORDS_DEFAULT = 2_000_000
RECORDS_QUICK = 200_000
PHASES = 12


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
@click.option("--at-rest/--no-at-rest", default=True, show_default=True,
              help="Write, read and compact a store at rest through the data source (--no-at-rest halves the "
                   "disk a large run needs).")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Work directory (default: a temporary one under the current directory).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--markdown-from", "markdown_from", multiple=True, metavar="JSON",
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Run nothing: print the Markdown tables of BENCHMARKS.md from these runs' JSON (repeatable).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --markdown-from: also plot each step's ratio to Parquet as a PNG here (needs matplotlib).")
def spark(records: int | None, streams: int, value_bytes: int, master: str, driver_memory: str, quick: bool,
          broker: bool, at_rest: bool, dir_path: Path | None, json_path: Path | None, markdown_from: tuple[Path, ...],
          plot_path: Path | None) -> None:
    """Read and write N records through the data source vs Spark's Parquet, and compaction MB/s; with a
    live broker, writes, reads, materialized reads and a streaming query's latency too."""
    if markdown_from:
        docs = [json.loads(p.read_text()) for p in markdown_from]
        click.echo(markdown(docs))
        if plot_path is not None:
            plot_ratios(docs, plot_path)
        return
    from stratalog.bench.spark import SparkBenchPlan, run_spark_bench
    from stratalog.spark import local_session

    console = make_console()
    plan = SparkBenchPlan(records or (RECORDS_QUICK if quick else RECORDS_DEFAULT), streams, value_bytes, master,
                          broker, at_rest)
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
                "Parquet s", "Parquet rows/s", "ratio", "of the ceiling", "target", "verdict"),
                left=("step", "target", "verdict"))
    steps = [("write (at rest)", doc["write"]), ("read (at rest)", doc["read"])] if "write" in doc else []
    b = doc.get("broker")
    if b:
        steps += [("write (broker)", b["write"]), ("read (broker)", b["read"]),
                  ("read (materialized)", b["materialized_read"])]
    for name, r in steps:
        out.add_row(name, f"{r['seconds']:.2f}", f"{r['rows_per_s']:,.0f}", f"{r['parquet_seconds']:.2f}",
                    f"{r['parquet_rows_per_s']:,.0f}", f"{r['ratio']:.2f}", _of_ceiling(doc, name, r),
                    f">= {r['target']['bound']:g}", verdict(r["target"]))
    console.print(out)
    ceiling = doc.get("ceiling")
    if ceiling:
        console.print(f"the ceiling, a Python source that does nothing: reads {ceiling['read']['rows_per_s']:,.0f} "
                      f"rows/s ({ceiling['read']['over_parquet']:.2f}x Parquet), writes "
                      f"{ceiling['write']['rows_per_s']:,.0f} rows/s ({ceiling['write']['over_parquet']:.2f}x)")
    if b:
        m, lat = b["materialize"], b["latency"]
        console.print(f"materialize: {m['files']} files, {m['bytes'] / 1e6:.1f} MB in {m['seconds']:.2f} s "
                      f"({m['rows_per_s']:,.0f} rows/s)")
        console.print(f"acknowledgement -> streaming output ({lat['trigger']} trigger, {lat['seen']:,} of "
                      f"{lat['records']:,} records): p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, "
                      f"max {lat['max_ms']:.0f} ms")
    c = doc.get("compact")
    if c:
        console.print(f"compaction: {c['objects_replaced']} objects -> {c['objects_written']} per-stream objects, "
                      f"{c['bytes_written'] / 1e6:.1f} MB in {c['seconds']:.2f} s = {c['mb_per_s']:.1f} MB/s")


def markdown(docs: list[dict[str, Any]]) -> str:
    """BENCHMARKS.md's tables for these runs: each step against Parquet, then materialization and latency."""
    steps, extra = [], []
    for doc in docs:
        p, b = doc["plan"], doc.get("broker")
        run = [("write, at rest", doc["write"]), ("read, at rest", doc["read"])] if "write" in doc else []
        if b:
            run += [("write, broker", b["write"]), ("read, broker", b["read"]),
                    ("read, materialized", b["materialized_read"])]
        ceiling = doc.get("ceiling")
        if ceiling:
            for kind in ("write", "read"):
                c = ceiling[kind]
                steps.append([f"{p['records']:,}", f"{p['value_bytes']} B", f"{kind}, a Python source doing nothing",
                              f"{c['seconds']:.2f}", f"{c['rows_per_s']:,.0f}",
                              f"{p['records'] / (c['seconds'] * c['over_parquet']):,.0f}", f"{c['over_parquet']:.2f}",
                              "1.00", "-"])
        for name, r in run:
            t = r["target"]
            steps.append([f"{p['records']:,}", f"{p['value_bytes']} B", name, f"{r['seconds']:.2f}",
                          f"{r['rows_per_s']:,.0f}", f"{r['parquet_rows_per_s']:,.0f}", f"{r['ratio']:.2f}",
                          _of_ceiling(doc, name, r), f">= {t['bound']:g}: {'met' if t['met'] else 'missed'}"])
        if b:
            m, lat = b["materialize"], b["latency"]
            extra.append([f"{p['records']:,}", f"{p['value_bytes']} B",
                          f"{m['files']} files, {m['bytes'] / 1e6:,.0f} MB in {m['seconds']:.1f} s",
                          f"{lat['p50_ms']:.0f} / {lat['p99_ms']:.0f} / {lat['max_ms']:.0f} ms "
                          f"({lat['seen']:,} records)"])
    return "\n".join([*provenance_lines(docs), "",
                      *markdown_table(("records", "value", "step", "seconds", "rows/s", "Parquet rows/s", "ratio",
                                       "of the ceiling", "target"), steps, left=("step", "target")),
                      *markdown_table(("records", "value", "materialize",
                                       "ack -> streaming output, 1 s trigger: p50 / p99 / max"), extra,
                                      left=("materialize", "ack -> streaming output, 1 s trigger: p50 / p99 / max"))])


def _of_ceiling(doc: dict[str, Any], step: str, r: dict[str, Any]) -> str:
    """A step's rows/s over the ceiling of its kind (a Python source doing nothing); "-" for the
    materialized read (Spark's own Parquet reader) and for runs made before the ceiling was measured."""
    ceiling = doc.get("ceiling")
    if not ceiling or "materialized" in step:
        return "-"
    kind = "write" if step.startswith("write") else "read"
    return f"{r['rows_per_s'] / ceiling[kind]['rows_per_s']:.2f}"


def _steps(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    steps = [("write\nat rest", doc["write"]), ("read\nat rest", doc["read"])] if "write" in doc else []
    b = doc.get("broker")
    if b:
        steps += [("write\nbroker", b["write"]), ("read\nbroker", b["read"]),
                  ("read\nmaterialized", b["materialized_read"])]
    return steps


def plot_ratios(docs: list[dict[str, Any]], path: Path) -> None:
    """Each step's rows/s over Parquet's, one bar per run, each step's target as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets: dict[str, float] = {}
    for doc in docs:  # every step any run has, in the order runs list them
        for name, r in _steps(doc):
            targets.setdefault(name, r["target"]["bound"])
    names = list(targets)
    width = 0.8 / len(docs)
    fig, ax = plt.subplots(figsize=(10, 4))
    for n, doc in enumerate(docs):
        p = doc["plan"]
        steps = dict(_steps(doc))  # a run without the at-rest steps leaves their places empty
        at = [i + n * width for i, name in enumerate(names) if name in steps]
        ax.bar(at, [steps[name]["ratio"] for name in names if name in steps], width,
               label=f"{p['records'] / 1e6:g} M records of {p['value_bytes']} B")
    for i, name in enumerate(names):
        ax.hlines(targets[name], i - width / 2, i + width * (len(docs) - 0.5), colors="black",
                  linestyles="dashed")
    ax.set_xticks([i + width * (len(docs) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("rows/s over Spark's Parquet (same run)")
    ax.set_title("stratalog data source against Spark's Parquet; dashed: targets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
