"""A benchmark's tables, built once from its JSON and rendered twice: on the console (rich) while it runs,
and as Markdown for BENCHMARKS.md (`stratalog bench <name> --markdown-from JSON`). What the report shows is
then exactly what the run printed, made from what it measured, and cannot drift from it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB_PER_GIB = 1024
#: Figures from this on are printed without decimals (1,234 ms, not 1,234.00): the digits after the point
#: say nothing beside them.
WHOLE_FIGURE_MIN = 100


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


def provenance(doc: dict[str, Any], machine: bool = True) -> str:
    """One Markdown sentence: when and on which code the figures were measured, by which command, on what
    machine (unless ``machine`` is false), how much else ran meanwhile (every figure is a ratio against a
    reference measured in the same run for that reason), and whether the machine was busy at the start."""
    commit = doc.get("commit")
    date = doc.get("date")
    # ISO 8601 in UTC, as write_json stamps it: to the minute is enough here.
    line = f"Measured {date[:16].replace('T', ' ')} UTC" if date else "Measured on a date not recorded"
    line += f" at commit {commit}" if commit else " (commit not recorded)"
    if doc.get("command"):
        line += f" by `{doc['command']}`"
    m = doc.get("machine")
    if m and machine:
        line += f" on {machine_text(m)}"
    other = doc.get("other_activity")
    if other:
        line += f"; meanwhile other processes used {other['other_cpu_s']:,.0f} CPU-s"
        if "other_disk_write_mib" in other:
            line += f" and wrote {other['other_disk_write_mib']:,.0f} MiB to the disk"
    busy = busy_at_start(doc)
    if busy:
        line += f"; **{busy}**"
    return line + "."


def busy_at_start(doc: dict[str, Any]) -> str | None:
    """"busy: ..." where the machine's load average was above its CPU count when the run began (its
    figures then say more about the machine than about the code), else None."""
    load = (doc.get("load_average_1m") or {}).get("start")
    cpus = (doc.get("machine") or {}).get("cpus")
    if load is None or not cpus or load <= cpus:
        return None
    return f"busy: a load average of {load:.1f} on {cpus} CPUs at the start"


def machine_text(m: dict[str, Any]) -> str:
    """2 x AMD EPYC, 24 GiB, ext4 on /dev/vda."""
    return (f"{m['cpus']} x {m['cpu_model']}, {m['memory_mib'] / MIB_PER_GIB:,.0f} GiB, {m['filesystem']} on "
            f"{m['disk_device']}")


def provenance_lines(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Several runs' provenance as a list; the machine said once when every run had the same."""
    machines = {machine_text(d["machine"]) for d in docs if d.get("machine")}
    if len(machines) != 1:
        return [f"- {provenance(d)}" for d in docs]
    return [f"- {provenance(d, machine=False)}" for d in docs] + ["", f"All on {machines.pop()}."]


def report(doc: dict[str, Any], tables: Sequence[FigureTable]) -> str:
    """A bench section's Markdown: the provenance line, then each table."""
    return "\n".join([provenance(doc), "", *(t.markdown() for t in tables)])
