"""Runs fuzz targets, each in a process of its own (``fuzz_child``), and reports what they found.

A run of one target is bounded by seconds and, optionally, by executions (whichever comes first), plus a
grace period for starting up; a child that outlives it is killed and reported. The figures come from
libFuzzer's own report (executions, coverage edges and features, corpus size), the findings from the
child's ``finding-*.json`` files and libFuzzer's ``crash-*``, ``timeout-*`` and ``oom-*`` inputs. A
target's *known issues* (see ``KnownIssue``) are counted apart from its findings.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Time a child gets beyond its fuzzing seconds: imports, instrumentation, loading the corpus.
STARTUP_S_MAX = 60.0
#: An input that runs longer than this is a hang (libFuzzer's -timeout).
INPUT_TIMEOUT_S = 10
#: libFuzzer stops the child above this resident size (its -rss_limit_mb): far above any target's need.
RSS_LIMIT_MB = 2048
#: Lines of a child's stderr kept for the report when it ends unexpectedly.
STDERR_TAIL_LINES = 30

_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)")
_ARTIFACT = re.compile(r"^(crash|timeout|oom|leak|slow-unit)-")


@dataclass(frozen=True, slots=True)
class FuzzConfig:
    seconds: float = 10.0
    #: Stop after this many executions (0: only the time bounds the run).
    runs_max: int = 0
    #: Findings of target T go to ``findings_dir/T``; the corpus grows in ``corpus_dir/T`` (kept between
    #: runs: a long campaign is many runs over one corpus). None: a temporary directory, removed after.
    findings_dir: Path = Path("fuzz-findings")
    corpus_dir: Path | None = None
    seed: int = 0
    #: End a target's run at its Nth finding (0: never; findings otherwise do not stop a run).
    stop_after_findings: int = 0


@dataclass(frozen=True, slots=True)
class Finding:
    target: str
    kind: str               # exception, allocation, crash, timeout, oom
    signature: str
    path: str
    detail: str = ""


@dataclass(slots=True)
class TargetFigures:
    target: str
    executions: int = 0
    seconds: float = 0.0
    coverage_edges: int = 0
    coverage_features: int = 0
    corpus_inputs: int = 0
    findings: list[Finding] = field(default_factory=list)
    known: list[Finding] = field(default_factory=list)
    exit_code: int = 0
    stderr_tail: str = ""

    @property
    def executions_per_s(self) -> float:
        return self.executions / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["executions_per_s"] = round(self.executions_per_s, 1)
        return out


def run_target(name: str, config: FuzzConfig) -> TargetFigures:
    """Fuzz one target in a child process and collect its figures and findings."""
    findings_dir = config.findings_dir / name
    findings_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"stratalog-fuzz-{name}-") as scratch:
        corpus_dir = (config.corpus_dir / name) if config.corpus_dir is not None else Path(scratch) / "corpus"
        corpus_dir.mkdir(parents=True, exist_ok=True)
        before = set(findings_dir.iterdir())
        flags = [f"-max_total_time={max(1, round(config.seconds))}", f"-artifact_prefix={findings_dir}/",
                 f"-timeout={INPUT_TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}", "-print_final_stats=1",
                 f"-seed={config.seed}" if config.seed else "-seed=0"]
        if config.runs_max:
            flags.append(f"-runs={config.runs_max}")
        command = [sys.executable, "-m", "stratalog.chaos.fuzz_child", name, str(findings_dir), str(corpus_dir),
                   str(config.stop_after_findings), *flags]
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False,
                                  timeout=config.seconds + STARTUP_S_MAX)
            exit_code, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as e:
            exit_code = -9
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        elapsed = time.monotonic() - started
    figures = _parse_stderr(name, stderr)
    figures.seconds = min(elapsed, _fuzz_seconds(stderr, elapsed))
    figures.exit_code = exit_code
    for path in sorted(set(findings_dir.iterdir()) - before):
        finding = _read_finding(name, path)
        if finding is not None:
            (figures.known if finding.kind == "known" else figures.findings).append(finding)
    if exit_code != 0 and not any(f.kind in ("crash", "timeout", "oom") for f in figures.findings):
        # The child died without telling why in a file (killed at the time bound, or Python failed to
        # start): that is a finding too, with the end of what it printed.
        figures.findings.append(Finding(name, "exit", f"exit code {exit_code}", "", _tail(stderr)))
    if figures.findings:
        figures.stderr_tail = _tail(stderr)
    return figures


def run_targets(names: Sequence[str], config: FuzzConfig,
                on_target: Callable[[TargetFigures], None] | None = None) -> list[TargetFigures]:
    results = []
    for name in names:
        figures = run_target(name, config)
        results.append(figures)
        if on_target is not None:
            on_target(figures)
    return results


def _parse_stderr(name: str, stderr: str) -> TargetFigures:
    figures = TargetFigures(name)
    for line in stderr.splitlines():
        status = _STATUS.match(line)
        if status:
            figures.executions = int(status[1])
            figures.coverage_edges, figures.coverage_features = int(status[2]), int(status[3])
            figures.corpus_inputs = int(status[4])
            continue
        executed = _EXECUTED.match(line)
        if executed:
            figures.executions = int(executed[1])
    return figures


def _fuzz_seconds(stderr: str, elapsed: float) -> float:
    """Seconds libFuzzer says it ran ("Done N runs in S second(s)"), else the child's whole time."""
    found = re.search(r"^Done \d+ runs in (\d+) second", stderr, re.MULTILINE)
    return float(found[1]) if found and int(found[1]) > 0 else elapsed


def _read_finding(target: str, path: Path) -> Finding | None:
    if path.name.startswith("finding-") and path.suffix == ".json":
        record = json.loads(path.read_text())
        return Finding(target, record["kind"], record["signature"], str(path), record["detail"])
    artifact = _ARTIFACT.match(path.name)
    if artifact:
        return Finding(target, artifact[1], path.name, str(path), path.read_bytes()[:256].hex())
    return None


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith("INFO: Instrumenting")]
    return "\n".join(lines[-STDERR_TAIL_LINES:])
