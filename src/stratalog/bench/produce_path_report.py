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


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [shape_table(shape) for shape in doc["shapes"]]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
