"""The command line's groups: every subcommand named in stratalog.commands resolves and is listed, and a
command imports only its own module (`stratalog serve` loads the broker, not the benchmarks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from stratalog.cli import cli
from stratalog.commands import BENCH, CHAOS, TOP

GROUPS = {(): TOP, ("bench",): BENCH, ("chaos",): CHAOS}


@pytest.mark.parametrize("path", sorted(GROUPS))
def test_every_named_command_resolves_and_is_listed(path: tuple[str, ...]) -> None:
    group = cli
    for name in path:
        group = cli.commands[name]  # type: ignore[assignment]
    assert isinstance(group, click.Group)
    context = click.Context(group)
    for name in GROUPS[path]:
        command = group.get_command(context, name)
        assert isinstance(command, click.Command), name
    listed = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    for name in GROUPS[path]:
        assert f"  {name} " in listed.output, (name, listed.output)


def test_an_unknown_command_is_refused_with_the_known_ones() -> None:
    result = CliRunner().invoke(cli, ["bench", "nothing"])
    assert result.exit_code == 2
    assert "No such command 'nothing'" in result.output


def test_serve_help_imports_no_benchmark_or_harness() -> None:
    code = ("import sys\nfrom stratalog.cli import main\nsys.argv = ['stratalog', 'serve', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('stratalog.bench', 'stratalog.chaos', "
            "'stratalog.commands.bench', 'stratalog.commands.chaos'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "Usage: stratalog serve" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_serve_writes_nothing_where_it_runs(tmp_path: Path) -> None:
    # Not even the .hypothesis/ directory that kio's import of hypothesis makes in a test environment.
    subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "serve", "--help"],
                   cwd=tmp_path, check=True, capture_output=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", sorted(GROUPS))
def test_readme_lists_every_command(path: tuple[str, ...]) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name in GROUPS[path]:
        assert f"stratalog {' '.join((*path, name))}" in readme, (path, name)
