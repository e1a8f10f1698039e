"""`bench kafka --server-cpus`: the servers on vCPUs of their own, the clients on the others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.bench.cpu_split import CpuSplit, CpuSplitError, parse_cpu_list, running_on
from stratalog.bench.kafka_report import cpu_split_text

CHILD_CPUS = "import os; print(','.join(str(c) for c in sorted(os.sched_getaffinity(0))))"


@pytest.mark.parametrize(("text", "cpus"), [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), (" 0, 4-5 ", {0, 4, 5})])
def test_a_cpu_list_is_read_as_taskset_writes_it(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "0,,1"])
def test_a_cpu_list_that_is_not_one_is_refused_with_its_form(text: str) -> None:
    with pytest.raises(CpuSplitError, match="is not a list of vCPUs such as 0, 0,2 or 0-3"):
        parse_cpu_list(text)


def test_the_clients_get_every_vcpu_the_servers_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    split = CpuSplit.of(frozenset({1}))
    assert split.describe() == {"server_cpus": [1], "client_cpus": [0, 2]}


@pytest.mark.parametrize(("servers", "said"), [
    ({2}, r"vCPU 2 is not one this process may run on \(0,1\)"),
    ({0, 1}, "vCPUs 0,1 are all the servers': none is left for the clients"),
])
def test_a_split_this_machine_cannot_make_is_refused(monkeypatch: pytest.MonkeyPatch, servers: set[int],
                                                       said: str) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    with pytest.raises(CpuSplitError, match=said):
        CpuSplit.of(frozenset(servers))


def test_a_process_started_on_cpus_runs_there_and_the_starter_goes_back_after() -> None:
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with running_on(frozenset({cpu})):
        child = subprocess.run([sys.executable, "-c", CHILD_CPUS], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(cpu)
    assert os.sched_getaffinity(0) == before


def test_the_report_says_where_servers_and_clients_ran_and_nothing_without_a_split() -> None:
    split = {"settings": {"cpu_split": {"server_cpus": [0], "client_cpus": [1]}}}
    assert cpu_split_text(split) == ("Each server ran on vCPU 0 alone and every client process on vCPU 1 "
                                     "(`--server-cpus`), in every phase. ")
    assert cpu_split_text({"settings": {"cpu_split": None}}) == ""
    assert cpu_split_text({"settings": {}}) == "", "a run from before the option"


def test_the_command_refuses_a_split_before_it_measures_anything(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stratalog.commands.bench_kafka import kafka

    missing = max(os.sched_getaffinity(0)) + 1
    result = CliRunner().invoke(kafka, ["--server-cpus", str(missing), "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 2, result.output
    assert f"vCPU {missing} is not one this process may run on" in result.output
    assert not (tmp_path / "data").exists()
