"""`stratalog bench produce-path`'s tables, made from the run's JSON only: printed by the run, and as Markdown
for BENCHMARKS.md by `stratalog bench produce-path --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import size_label
from stratalog.bench.tables import FigureTable, report


def shape_table(shape: dict[str, Any]) -> FigureTable:
    count, size = shape["records"], size_label(shape["value_bytes"])
    out = FigureTable(f"One Produce request of one batch of {count:,} record{'s' if count > 1 else ''} of {size}: "
                      "each step's time, in this process, with the Python twins and with the compiled core",
                      ("step", "Python µs", "compiled µs", "Python ns/record", "compiled ns/record", "speed-up",
                       "share, compiled"), left=("step",))
    steps = shape["steps"]
    for row in [r for r in steps if not r.get("optional")]:
        _step_row(out, row, count, shape["compiled_us"])
    out.add("all of it", f"{shape['python_us']:,.2f}", f"{shape['compiled_us']:,.2f}",
            f"{shape['python_us'] * 1000 / count:,.1f}", f"{shape['compiled_us'] * 1000 / count:,.1f}",
            f"{shape['python_us'] / shape['compiled_us']:,.1f}x", "100%")
    for row in [r for r in steps if r.get("optional")]:  # only under a topic's codec: its share is extra
        _step_row(out, {**row, "step": f"+ {row['step']}"}, count, shape["compiled_us"])
    return out


def _step_row(out: FigureTable, row: dict[str, Any], count: int, total_us: float) -> None:
    python, compiled = row["python_us"], row["compiled_us"]
    taken = python if compiled is None else compiled
    out.add(row["step"], f"{python:,.2f}", "-" if compiled is None else f"{compiled:,.2f}",
            f"{python * 1000 / count:,.1f}", f"{taken * 1000 / count:,.1f}",
            "-" if compiled is None else f"{python / compiled:,.1f}x", f"{taken / total_us:.0%}")


#: The runs of the trace a document may hold: its key, and how the WAL wrote its blocks in it.
TRACES = (("trace", "the WAL's blocks written by the compiled writer, the appends completed by the event loop"),
          ("trace_reaper", "the WAL's blocks written by the compiled writer, the appends completed by its reaper "
           "thread (wal_completion_backstop_ms=0)"),
          ("trace_python_io", "the WAL's blocks written by Python I/O threads, the compiled writer's twin"))


def trace_table(trace: dict[str, Any], how: str = "") -> FigureTable:
    """Each hand-over of a produce through a live broker, per pattern, at p50 and p99."""
    patterns = trace["patterns"]
    heads = [f"{p['pattern']}: {q}" for p in patterns for q in ("p50 ms", "p99 ms")]
    out = FigureTable(f"One Produce of one {trace['value_bytes']} B record (acks=all) through a broker in this "
                      f"process, {trace['requests']:,} requests per pattern{', ' + how if how else ''}: each step's "
                      "time", ("step", *heads), left=("step",))
    for i, step in enumerate(patterns[0]["steps"]):
        out.add(step["step"], *(f"{p['steps'][i][q]:.3f}" for p in patterns for q in ("p50_ms", "p99_ms")))
    out.add("in the broker, from the handler to the socket", *(f"{p['broker_p50_ms']:.3f}" if q == "p50" else "-"
                                                            for p in patterns for q in ("p50", "p99")))
    out.add("round trip, as the client saw it", *(f"{p[f'round_trip_{q}_ms']:.3f}" for p in patterns
                                                  for q in ("p50", "p99")))
    disk = trace.get("disk_reference", {})
    if "p50_ms" in disk:
        out.add(f"ref: the bare disk's synced 4 KiB write, {disk['pattern']}", f"{disk['p50_ms']:.3f}",
                f"{disk['p99_ms']:.3f}", *["-"] * (len(heads) - 2))
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    shapes = [shape_table(shape) for shape in doc["shapes"]]
    return shapes + [trace_table(doc[key], how) for key, how in TRACES if key in doc]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
