"""A benchmark's tables, built once from its JSON and rendered twice: on the console (rich) while it runs,
and as Markdown for BENCHMARKS.md (`stratalog bench <name> --markdown-from JSON`). What the report shows is
then exactly what the run printed, made from what it measured, and cannot drift from it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB_PER_GIB = 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    """A target's outcome in a table cell: met, missed, or not applicable (``None``)."""

    met: bool | None

    def markdown(self) -> str:
        if self.met is None:
            return "n/a"
        return "met" if self.met else "**missed**"

    def rich(self) -> str:
        if self.met is None:
            return "[yellow]n/a[/]"
        return "[green]PASS[/]" if self.met else "[red]MISS[/]"


Cell = str | Verdict


@dataclass(slots=True)
class FigureTable:
    """A titled table of preformatted cells. ``left`` names the columns of text (the rest are figures,
    right-aligned)."""

    title: str
    heads: tuple[str, ...]
    left: Collection[str] = ()
    rows: list[list[Cell]] = field(default_factory=list)

    def add(self, *cells: Cell) -> None:
        assert len(cells) == len(self.heads), (self.title, cells)
        self.rows.append(list(cells))

    def markdown(self) -> str:
        """The title as a sentence, then the table."""
        return "\n".join([f"{self.title}.", "", *markdown_table(self.heads, self.rows, self.left)])

    def rich(self) -> Any:
        from rich.table import Table

        out = Table(title=self.title, title_justify="left")
        for head in self.heads:
            out.add_column(head, justify="left" if head in self.left else "right")
        for row in self.rows:
            out.add_row(*(c.rich() if isinstance(c, Verdict) else c for c in row))
        return out


def markdown_table(heads: Sequence[str], rows: Sequence[Sequence[Cell]], left: Collection[str]) -> list[str]:
    """A Markdown table's lines (text columns left-aligned, figures right-aligned) and a blank line after."""

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(values) + " |"

    align = ["---" if head in left else "---:" for head in heads]
    body = [line([c.markdown() if isinstance(c, Verdict) else c for c in row]) for row in rows]
    return [line(heads), line(align), *body, ""]


def targets_table(rows: Sequence[tuple[str, str, bool | None]]) -> FigureTable:
    """(target, what was measured, met) per target: the closing table of every bench's section."""
    out = FigureTable("Targets", ("target", "measured", ""), left=("target", "measured"))
    for name, measured, met in rows:
        out.add(name, measured, Verdict(met))
    return out


def provenance(doc: dict[str, Any]) -> str:
    """One Markdown line: when and on which code the figures were measured, by which command, on what
    machine, and how much else ran meanwhile (every figure is a ratio against a reference measured in
    the same run for that reason)."""
    date = str(doc.get("date") or "date not recorded").replace("T", " ").replace("+00:00", " UTC")
    commit = doc.get("commit")
    command = doc.get("command")
    parts = [f"Measured {date}", f"at commit {commit}" if commit else "commit not recorded"]
    line = ", ".join(parts)
    if command:
        line += f", by `{command}`"
    m = doc.get("machine")
    if m:
        line += (f". Machine: {m['cpus']} x {m['cpu_model']}, {m['memory_mib'] / MIB_PER_GIB:,.0f} GiB, "
                 f"Linux {m['kernel']}, Python {m['python']}, {m['filesystem']} on {m['disk_device']}")
    other = doc.get("other_activity")
    if other:
        line += f". Meanwhile other processes used {other['other_cpu_s']:,.1f} CPU-s"
        if "other_disk_write_mib" in other:
            line += f" and wrote {other['other_disk_write_mib']:,.0f} MiB to the disk"
        line += f", and the hypervisor stole {other['steal_cpu_s']:,.1f} CPU-s"
    return line + "."


def report(doc: dict[str, Any], tables: Sequence[FigureTable]) -> str:
    """A bench section's Markdown: the provenance line, then each table."""
    return "\n".join([provenance(doc), "", *(t.markdown() for t in tables)])
