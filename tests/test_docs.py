"""docs/'s examples are what they say: each `stratalog` command line names commands and options that exist
(parsed by the CLI itself, as a shell would pass it), each TOML block loads as a broker config, and
the commands that finish in a moment run. docs/spark.md's Python blocks run in test_broker_spark.py,
against a live broker and a Spark session; README.md's in test_readme.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from stratalog.cli import cli
from stratalog.commands.serve import load_config

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: Code blocks whose language is one of these hold command lines (untagged blocks too, when they do).
SHELL_BLOCKS = ("", "sh")


def code_blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.DOTALL) if lang == language]


def command_lines() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every line of a shell block in docs/ that runs `stratalog`, comments and a
    trailing ``&`` removed."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        for language in SHELL_BLOCKS:
            for block in code_blocks(path, language):
                for line in block.splitlines():
                    if not line.startswith("stratalog "):
                        continue  # prose, a diagram, a file listing
                    words = shlex.split(line, comments=True)
                    found.append((f"{path.name}: {line.strip()}", [w for w in words[1:] if w != "&"]))
    return found


def parse(args: list[str]) -> click.Command:
    """The command ``args`` names, its options parsed as running it would parse them (raises click's
    UsageError or BadParameter for an unknown command, an unknown option or a bad value). The groups on
    the way take no options in these lines."""
    command: click.Command = cli
    parent = click.Context(cli, info_name="stratalog")
    while isinstance(command, click.Group):
        name, *args = args
        sub = command.get_command(parent, name)
        if sub is None:
            raise click.UsageError(f"no command {name!r}")
        parent, command = click.Context(sub, info_name=name, parent=parent), sub
    command.make_context(command.name, list(args), parent=parent.parent)
    return command


COMMANDS = command_lines()


def test_the_docs_have_command_lines_to_check() -> None:
    places = {where.split(":")[0] for where, _ in COMMANDS}
    assert {"fuzzing.md", "spark.md"} <= places, places


@pytest.mark.parametrize("args", [args for _, args in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_each_command_line_in_the_docs_parses(args: list[str]) -> None:
    assert parse(args).callback is not None


def test_a_misspelt_option_would_be_caught() -> None:
    with pytest.raises(click.UsageError, match="--secs"):
        parse(["chaos", "fuzz", "--secs", "60"])


def test_fuzzings_listing_command_runs_as_written() -> None:
    ((_, args),) = [(w, a) for w, a in COMMANDS if a == ["chaos", "fuzz", "--list"]]
    done = subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "kafka_batch" in done.stdout and "wal_recovery" in done.stdout


@pytest.mark.parametrize("number", range(len(code_blocks(DOCS / "broker.md", "toml"))))
def test_each_broker_config_example_loads(tmp_path: Path, number: int) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(code_blocks(DOCS / "broker.md", "toml")[number])
    config = load_config(path)  # validated too: a bad value raises BadParameter
    for table, settings in tomllib.loads(path.read_text()).items():
        if not isinstance(settings, dict):
            continue
        for name, value in settings.items():  # each setting reached its config, as written
            got = getattr(getattr(config, table), name)
            assert (list(got) if isinstance(got, tuple) else getattr(got, "value", got)) == value, (table, name)
