"""The fuzzing process: one target under atheris (libFuzzer), started by ``stratalog.chaos.fuzz``.

    python -m stratalog.chaos.fuzz_child TARGET FINDINGS_DIR CORPUS_DIR STOP_AFTER [libFuzzer flags...]

stratalog is imported under atheris' instrumentation, so libFuzzer sees which branches of the parsers
each input reaches. Each input runs inside the contract check: an exception outside the target's
contract, a ContractViolationError, or a Python allocation peak above the target's bound is a *finding*. A
finding does not stop the run (one bug would otherwise hide every other): its first input and traceback
go to ``FINDINGS_DIR/<signature>.json`` and the fuzzer goes on, unless STOP_AFTER (> 0) findings are in.
Hangs (-timeout) and memory beyond -rss_limit_mb stop the process; libFuzzer writes those inputs itself
(``timeout-*``, ``oom-*``, with -artifact_prefix set to FINDINGS_DIR) and the parent reports them.

Nothing from stratalog is imported at the top: what is imported before the instrumentation starts is
not instrumented.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import traceback
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path

#: Frames of a finding's traceback kept in its signature: the innermost one names the line that failed.
SIGNATURE_FRAMES = 2
#: RSS may grow by this much over one input before it counts as an allocation finding (a new peak of the
#: process, measured by getrusage): catches native allocations tracemalloc does not see (kio's parser,
#: cramjam's decompressors) long before libFuzzer's -rss_limit_mb ends the run.
RSS_GROWTH_BYTES_MAX = 256 << 20


def _signature(error: BaseException) -> str:
    """``Type@file:line;file:line`` of the innermost frames in stratalog (all frames if none is). Walks
    the traceback by hand: ``traceback.extract_tb`` reads source lines, which cost more than the input."""
    frames: list[tuple[str, int]] = []
    tb = error.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    ours = [f for f in frames if "stratalog" in f[0]] or frames
    where = ";".join(f"{Path(name).name}:{line}" for name, line in ours[-SIGNATURE_FRAMES:])
    return f"{type(error).__name__}@{where}"


class _Findings:
    """Findings by signature; each written once, when first seen."""

    def __init__(self, directory: Path, target: str, stop_after: int) -> None:
        self._directory = directory
        self._target = target
        self._seen: set[str] = set()
        #: End the run once this many findings are written (0: never): a harness test that looks for a
        #: planted bug stops when it is found, its run bounded by a count of inputs and not by the clock.
        self._stop_after = stop_after

    def add(self, signature: str, kind: str, data: bytes, detail: Callable[[], str]) -> None:
        if signature in self._seen:
            return
        self._seen.add(signature)
        digest = hashlib.sha1(signature.encode()).hexdigest()[:16]
        record = {"target": self._target, "kind": kind, "signature": signature, "input_hex": data.hex(),
                  "input_bytes": len(data), "detail": detail()}
        path = self._directory / f"finding-{digest}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"FINDING {kind} {signature} -> {path}", file=sys.stderr, flush=True)
        if self._stop_after and len(self._seen) >= self._stop_after:
            print(f"STOPPED after {len(self._seen)} finding(s)", file=sys.stderr, flush=True)
            os._exit(0)   # libFuzzer's loop has no way out but the process's end; the finding is written


def main(argv: list[str]) -> None:
    import atheris  # type: ignore[import-untyped]  # no type information published

    target_name, findings_dir, corpus_dir, stop_after = argv[1], Path(argv[2]), Path(argv[3]), int(argv[4])
    # kio (the Kafka schemas) imports hypothesis when it can, as in a test environment: half a second of
    # every Kafka target's start. No target uses it (as cli.main, which keeps it out of every command).
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    with atheris.instrument_imports(include=["stratalog"]):
        from stratalog.chaos.fuzz_targets import find_target

        target = find_target(target_name)
    for function in target.coverage_functions():
        atheris.instrument_func(function)
    findings = _Findings(findings_dir, target.name, stop_after)
    _write_seeds(corpus_dir, target.seeds())
    contract = target.contract
    known = target.known_issues
    run = target.run
    bound = target.allocation_bytes_max
    tracemalloc.start(1)
    # Warm up outside the checks: first calls fill caches (kio's schemas, struct formats) once.
    for seed in target.seeds()[:64]:
        try:
            run(seed)
        except Exception:   # a seed that fails is reported when the fuzzer runs it
            continue
    rss_peak = [_rss_bytes()]

    def one_input(data: bytes) -> None:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            run(data)
        except contract:
            pass
        except Exception as error:
            kind = "known" if any(issue.matches(error) for issue in known) else "exception"
            findings.add(_signature(error), kind, data, partial(_format, error))
        peak = tracemalloc.get_traced_memory()[1] - before
        allowed = bound(len(data))
        if peak > allowed:
            findings.add(f"allocation@{target.name}", "allocation", data, lambda: (
                         f"an input of {len(data)} bytes allocated {peak} bytes through Python at peak; "
                         f"the target's bound for it is {allowed}"))
        rss = _rss_bytes()
        if rss > rss_peak[0]:
            if rss - rss_peak[0] > RSS_GROWTH_BYTES_MAX:
                findings.add(f"rss@{target.name}", "allocation", data, lambda: (
                             f"the process grew from {rss_peak[0]} to {rss} bytes (RSS) over one input of "
                             f"{len(data)} bytes"))
            rss_peak[0] = rss

    flags = [argv[0], str(corpus_dir), f"-max_len={target.input_bytes_max}", *argv[5:]]
    atheris.Setup(flags, one_input)
    atheris.Fuzz()


def _format(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def _write_seeds(corpus_dir: Path, seeds: list[bytes]) -> None:
    corpus_dir.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        path = corpus_dir / f"seed-{hashlib.sha1(seed).hexdigest()}"
        if not path.exists():
            path.write_bytes(seed)


if __name__ == "__main__":
    main(sys.argv)
