"""The fuzzing harness (stratalog.chaos.fuzz*): every target runs briefly under atheris with no finding,
a planted bug is found, and the codec's two findings stay fixed."""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratalog.chaos.fuzz import FuzzConfig, TargetFigures, run_target
from stratalog.chaos.fuzz_selftest import PLANTED_PREFIX
from stratalog.chaos.fuzz_targets import TARGET_MODULES, find_target, registry, selftest_registry, target_names
from stratalog.cli import cli
from stratalog.kafka.codec import KafkaProtocolError, decode_request

TARGETS = target_names()
#: Each target in the run below stops after this many inputs, its seeds included, or its seeds and
#: EXECUTIONS_MIN more where it has more seeds (the Kafka request target: one or more per version served):
#: most run thousands of inputs a second, so the child's start (about 2 s of instrumented imports) is most
#: of a target's time; the slowest (WAL recovery: open, recover, append, reopen) runs 250-500 a second on a
#: quiet machine.
RUNS_PER_TARGET = 300
#: Only a bound on a target that hangs: a run is ended by its count of inputs, never by the clock, so a
#: busy machine takes longer and gives the same answer.
SECONDS_PER_TARGET_MAX = 300.0
#: Inputs every target runs at least.
EXECUTIONS_MIN = 100


@pytest.fixture(scope="module")
def brief_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TargetFigures]:
    """Every target, two at a time (the machine has two cores), each for RUNS_PER_TARGET inputs at most."""
    findings_dir = tmp_path_factory.mktemp("findings")

    def brief(name: str) -> TargetFigures:
        # A target's seeds all run, and EXECUTIONS_MIN inputs past them at least: the Kafka request target's
        # seeds grow with every API version served.
        runs = max(RUNS_PER_TARGET, len(find_target(name).seeds()) + EXECUTIONS_MIN)
        return run_target(name, FuzzConfig(seconds=SECONDS_PER_TARGET_MAX, runs_max=runs, findings_dir=findings_dir))

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(brief, TARGETS))
    return {r.target: r for r in results}


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_target_runs_without_findings(brief_run: dict[str, TargetFigures], name: str) -> None:
    figures = brief_run[name]
    assert figures.findings == [], "\n".join(f"{f.kind} {f.signature}\n{f.detail}" for f in figures.findings)
    assert figures.exit_code == 0, figures.stderr_tail
    assert figures.executions >= max(EXECUTIONS_MIN, len(find_target(name).seeds()))
    assert figures.coverage_edges > 0


@pytest.mark.parametrize("name", TARGETS)
def test_every_seed_keeps_the_contract(name: str) -> None:
    target = find_target(name)
    for seed in target.seeds():
        with contextlib.suppress(*target.contract):
            target.run(seed)


def test_each_module_defines_the_targets_the_table_names() -> None:
    for module, names in TARGET_MODULES.items():
        defined = importlib.import_module(f"stratalog.chaos.{module}").TARGETS
        assert tuple(t.name for t in defined) == names, module
    assert list(registry()) == TARGETS and list(selftest_registry()) == ["selftest_exception", "selftest_allocation"]
    assert find_target("wal_recovery").name == "wal_recovery"
    with pytest.raises(KeyError, match="no fuzz target 'nope'; there are: kafka_request"):
        find_target("nope")


def test_a_fuzzing_child_imports_only_its_targets_module() -> None:
    code = ("import sys; from stratalog.chaos.fuzz_targets import find_target; find_target('wal_object'); "
            "print(sorted(m for m in sys.modules if m.startswith('stratalog.chaos.fuzz_')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['stratalog.chaos.fuzz_targets', 'stratalog.chaos.fuzz_wal']"


def test_the_docs_table_lists_exactly_the_registered_targets() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "fuzzing.md").read_text()
    table = text[text.index("| target | parser |"):text.index("Parsers that check a CRC first")]
    assert sorted(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)) == sorted(TARGETS)


#: A planted bug's run ends at its finding, a few hundred inputs in (42-387 in ten runs); this only bounds a
#: harness that never finds it.
PLANTED_RUNS_MAX = 100_000


def planted(findings_dir: Path) -> FuzzConfig:
    return FuzzConfig(seconds=SECONDS_PER_TARGET_MAX, runs_max=PLANTED_RUNS_MAX, stop_after_findings=1,
                      findings_dir=findings_dir)


@pytest.mark.slow
def test_a_planted_exception_is_reported_with_its_input(tmp_path: Path) -> None:
    figures = run_target("selftest_exception", planted(tmp_path))
    assert [f.kind for f in figures.findings] == ["exception"]
    finding = figures.findings[0]
    assert finding.signature.startswith("KeyError@") and "fuzz_selftest.py" in finding.signature
    record = json.loads(Path(finding.path).read_text())
    assert bytes.fromhex(record["input_hex"]).startswith(b"BUG!")
    assert "KeyError: 'planted'" in record["detail"]
    assert figures.exit_code == 0   # a finding does not stop the run


@pytest.mark.slow
def test_a_planted_allocation_is_reported(tmp_path: Path) -> None:
    figures = run_target("selftest_allocation", planted(tmp_path))
    assert [f.kind for f in figures.findings] == ["allocation"]
    record = json.loads(Path(figures.findings[0].path).read_text())
    assert bytes.fromhex(record["input_hex"]).startswith(b"B")


@pytest.mark.slow
def test_the_cli_prints_the_table_and_exits_1_on_a_finding(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    # The planted input is in the corpus the run starts from: found at once, whatever the machine's speed.
    corpus = tmp_path / "corpus"
    (corpus / "selftest_exception").mkdir(parents=True)
    (corpus / "selftest_exception" / "planted").write_bytes(PLANTED_PREFIX + b"!")
    result = CliRunner().invoke(cli, ["chaos", "fuzz", "--seconds", str(SECONDS_PER_TARGET_MAX), "--runs", "300",
                                      "--target", "selftest_exception", "--target", "queue_manifest",
                                      "--corpus-dir", str(corpus), "--findings-dir", str(tmp_path / "f"),
                                      "--json", str(out)])
    assert result.exit_code == 1, result.output
    assert "selftest_exception" in result.output and "1 finding(s)" in result.output
    figures = {t["target"]: t for t in json.loads(out.read_text())["targets"]}
    assert len(figures["selftest_exception"]["findings"]) == 1
    assert figures["queue_manifest"]["findings"] == [] and figures["queue_manifest"]["executions"] > 0


# Findings in kafka/codec.py, now regression tests. ---------------------------------------------------

#: A FindCoordinator v3 request whose header carries tagged field 16383: kio raised KeyError through the codec.
UNKNOWN_TAG_FRAME = bytes.fromhex("000a000300000008000008ffff0002740100")
#: ListOffsets v6 (89 bytes) whose topics array claims about 0x35000000 elements: kio asked for ~116 GB
#: and the process aborted.
PREALLOCATION_FRAME = bytes.fromhex(
    "00020006000000" "08ffff0000000001" "01ffffffff35000000010000000100000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000002101000000")
SERVED = {10: (0, 4), 2: (1, 7)}


def test_an_unknown_tagged_field_is_refused_as_a_protocol_error() -> None:
    with pytest.raises(KafkaProtocolError, match="tagged field"):
        decode_request(UNKNOWN_TAG_FRAME, SERVED)


def test_an_array_count_beyond_the_frame_is_refused_before_kio_allocates() -> None:
    # In a child: were the check missing, the allocation failure would abort the process.
    code = ("import sys\nfrom stratalog.kafka.codec import KafkaProtocolError, decode_request\n"
            f"try:\n    decode_request(bytes.fromhex({PREALLOCATION_FRAME.hex()!r}), {SERVED!r})\n"
            "except KafkaProtocolError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-500:]
    assert b"an array of" in done.stdout
