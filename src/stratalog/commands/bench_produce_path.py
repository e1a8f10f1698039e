"""`stratalog bench produce-path`: the command-line shell around :mod:`stratalog.bench.produce_path`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stratalog.bench.common import write_json
from stratalog.bench.produce_path import LOOP_RECORDS, LOOP_RECORDS_QUICK, SHAPES, run_produce_path_bench
from stratalog.bench.produce_path_report import markdown_report, tables
from stratalog.commands.bench_log import bench_dir, make_console, progress_bar

REPEATS_DEFAULT = 7
REPEATS_QUICK = 2
#: Steps timed per shape (both cores count as one), the recompression steps among them.
STEPS_PER_SHAPE = 7
#: Requests per pattern of the trace through a live broker: 10 s at 50 a second.
TRACE_REQUESTS_DEFAULT = 500
TRACE_REQUESTS_QUICK = 50


@click.command(name="produce-path")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help=f"Timed loops per step; the least is kept [default: {REPEATS_DEFAULT}; --quick: {REPEATS_QUICK}].")
@click.option("--quick", is_flag=True, help=f"{REPEATS_QUICK} loops per step, each of a tenth the calls "
              f"({LOOP_RECORDS_QUICK:,} records instead of {LOOP_RECORDS:,}), and {TRACE_REQUESTS_QUICK} traced "
              "requests per pattern: every table in seconds, its figures rougher.")
@click.option("--trace/--no-trace", default=True, show_default=True,
              help="Also send produces through a broker run in this process, timing each hand-over.")
@click.option("--dir", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the traced broker keeps its data (its disk is timed) [default: a new directory here].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
def produce_path(repeats: int | None, quick: bool, trace: bool, data_dir: Path | None, json_path: Path | None,
                 markdown_from: Path | None) -> None:
    """Each computing step of a Produce request (decode, batch check, record check, placing, response) on
    one batch, timed in this process with the Python twins and with the compiled core: where a request's
    time goes, and what the compiled core saves. No server, no disk.

    Then (--trace) the whole of a produce: a broker runs in this process and one 256 B record per request
    goes through it, 50 a second and then back to back, timed at each hand-over (append, the writer's
    thread and the device, the completion, the response), beside the bare disk's own synced write."""
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
    console = make_console()
    with progress_bar(console, len(SHAPES) * STEPS_PER_SHAPE) as bar:
        done = [0]

        def progress() -> None:
            done[0] += 1
            bar.phase(f"step {done[0]} of {len(SHAPES) * STEPS_PER_SHAPE}")

        doc = run_produce_path_bench(repeats or (REPEATS_QUICK if quick else REPEATS_DEFAULT), progress,
                                     LOOP_RECORDS_QUICK if quick else LOOP_RECORDS)
    if trace:
        from stratalog.bench.produce_trace import PATTERNS
        from stratalog.bench.produce_trace import trace as run_trace
        from stratalog.commands.serve import load_config, run_broker

        requests = TRACE_REQUESTS_QUICK if quick else TRACE_REQUESTS_DEFAULT
        config = load_config(None)
        # The same trace with the WAL's compiled writer (its results taken by the event loop, then by its
        # reaper thread), then with its twin, the Python I/O threads.
        runs = (("trace", config), ("trace_reaper", dataclasses.replace(config, wal_completion_backstop_ms=0)),
                ("trace_python_io", dataclasses.replace(config, store=dataclasses.replace(
                    config.store, wal=dataclasses.replace(config.store.wal, compiled_io=False)))))
        with progress_bar(console, len(runs)) as bar, bench_dir(data_dir) as where:
            for key, run_config in runs:
                bar.phase(f"the disk, then produces through a broker in this process ({len(PATTERNS)} x "
                          f"{requests}; {key})")
                doc[key] = run_trace(where / key, requests, _counter(bar, len(PATTERNS) * requests), run_broker,
                                     run_config)
    for t in tables(doc):
        console.print(t.rich())
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")


def _counter(bar: Any, total: int) -> Callable[[], None]:
    """A callback that moves ``bar`` on by one of ``total`` steps each time it is called."""
    sent = [0]

    def one_more() -> None:
        sent[0] += 1
        bar.advance(sent[0] / total)
    return one_more
