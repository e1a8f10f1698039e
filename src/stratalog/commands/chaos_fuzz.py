"""``stratalog chaos fuzz``: coverage-guided fuzzing of every parser, one target after another."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.chaos.fuzz import FuzzConfig, TargetFigures, run_targets


def figures_table(results: list[TargetFigures], title: str = "Fuzzing") -> Table:
    """One row per target: executions, rate, coverage, known issues; findings red unless zero."""
    table = Table(title=title, title_justify="left")
    for column in ("target", "executions", "exec/s", "edges", "features", "corpus", "known", "findings"):
        table.add_column(column, justify="left" if column == "target" else "right", no_wrap=True)
    for r in results:
        style = "green" if not r.findings else "bold red"
        table.add_row(r.target, f"{r.executions:,}", f"{r.executions_per_s:,.0f}", f"{r.coverage_edges:,}",
                      f"{r.coverage_features:,}", f"{r.corpus_inputs:,}", f"{len(r.known)}",
                      f"[{style}]{len(r.findings)}[/]")
    return table


@click.command("fuzz")
@click.option("--seconds", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Fuzzing time per target.")
@click.option("--runs", "runs_max", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also stop a target after this many executions (0: no limit).")
@click.option("--stop-after", "stop_after_findings", type=click.IntRange(min=0), default=0, show_default=True,
              help="End a target's run at its Nth finding (0: never; a finding otherwise does not stop it).")
@click.option("--target", "targets", multiple=True, metavar="NAME",
              help="Run only this target (repeatable). Default: every target.")
@click.option("--list", "list_only", is_flag=True, help="List the targets and exit.")
@click.option("--findings-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("fuzz-findings"),
              show_default=True, help="Each finding's input and traceback go to DIR/<target>/.")
@click.option("--corpus-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep each target's corpus in DIR/<target>/ and start from it next time (long campaigns).")
@click.option("--seed", type=int, default=0, show_default=True, help="libFuzzer's seed (0: from the clock).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write each target's figures and findings as JSON here.")
def fuzz(seconds: float, runs_max: int, stop_after_findings: int, targets: tuple[str, ...], list_only: bool,
         findings_dir: Path, corpus_dir: Path | None, seed: int, json_path: Path | None) -> None:
    """Fuzz every parser (Kafka requests, frames and batches; WAL recovery; objects, manifests, bulk
    records; queue objects and names) with atheris, each target in its own process.

    A finding is an input that makes a parser raise an error outside its contract, return a value that
    breaks it, hang, or allocate far beyond the input. Exits 1 when any target found one; each finding's
    input is in --findings-dir.
    """
    from stratalog.chaos.fuzz_targets import find_target, registry

    known = registry()
    if list_only:
        for target in known.values():
            click.echo(f"{target.name:16} {target.summary}")
        return
    names = list(targets) or list(known)
    for name in names:
        try:
            find_target(name)
        except KeyError as e:
            raise click.BadParameter(str(e.args[0]), param_hint="--target") from None
    console = Console()
    config = FuzzConfig(seconds=seconds, runs_max=runs_max, findings_dir=findings_dir, corpus_dir=corpus_dir,
                        seed=seed, stop_after_findings=stop_after_findings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("fuzzing", total=len(names), status=names[0])

        def on_target(figures: TargetFigures) -> None:
            done = int(progress.tasks[0].completed) + 1
            progress.update(task, advance=1, status=names[done] if done < len(names) else "")

        results = run_targets(names, config, on_target)
    console.print(figures_table(results))
    if json_path is not None:
        payload = {"command": "chaos fuzz", "parameters": {"seconds": seconds, "runs": runs_max, "seed": seed},
                   "targets": [r.as_dict() for r in results]}
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
    found = [f for r in results for f in r.findings]
    for finding in found:
        console.print(f"{finding.target}: {finding.kind} {finding.signature} ({finding.path})", style="red",
                      markup=False, highlight=False)
    if found:
        console.print(f"[bold red]{len(found)} finding(s)[/]; inputs are in {findings_dir}")
        raise SystemExit(1)
