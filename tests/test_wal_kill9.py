"""The WAL under kill -9: a child process appends, the test SIGKILLs it, recovers and checks every record.

pytest's tmp_path is under /tmp, on the same ext4 disk as the project here, so the log uses O_DIRECT +
O_DSYNC as in production; where /tmp refuses O_DIRECT the log falls back to buffered writes + fdatasync,
which is still a real file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import stratalog.chaos.wal as chaos_wal
from stratalog.chaos.wal import WALChaosConfig, WALChaosFigures, run_wal_chaos
from stratalog.chaos.wal_child import (
    FILLER_BYTES_MAX,
    RECORD_PREFIX,
    parse_child_output,
    record_body,
    record_identity,
)
from stratalog.commands.chaos_wal import wal as chaos_wal_command

ITERATIONS = 50
#: A short kill window keeps 50 rounds near 10 s (about 20 s on a loaded 2-CPU machine). Its 20 ms floor
#: leaves room for acknowledgements even under load: with a 5 ms floor, 1 kill in 6 came before the first
#: acknowledgement while other jobs hogged the CPUs and the disk.
QUICK = WALChaosConfig(iterations=ITERATIONS, seed=20240611, capacity_bytes=8 << 20,
                       kill_after_s_min=0.02, kill_after_s_max=0.08)


def _run(tmp_path: Path, config: WALChaosConfig) -> WALChaosFigures:
    return run_wal_chaos(tmp_path / "kill9.wal", config)


@pytest.mark.slow
def test_no_acknowledged_record_is_lost_across_kill9_rounds(tmp_path: Path) -> None:
    figures = _run(tmp_path, QUICK)

    assert figures.iterations == ITERATIONS
    assert figures.acknowledged_lost == 0
    assert figures.corrupt_returned == 0
    assert figures.below_trim_returned == 0
    assert figures.failures == 0, figures
    # The checks above mean something only if the writer got acknowledgements before most kills, and
    # recovery then had acknowledged records to return.
    assert figures.iterations_with_acks >= 0.7 * ITERATIONS, figures
    assert figures.iterations_verifying_acks >= 0.8 * ITERATIONS, figures
    assert figures.records_recovered > 0
    assert figures.trims_completed > 0
    assert figures.ring_laps > 2, "the ring should wrap several times over the rounds"


# The checks can fail: sabotage what the parent's recovery returns and watch the right count move. ------

#: Two rounds of ~100 ms: enough for megabytes of acknowledged records to sabotage, even under load.
SABOTAGE = WALChaosConfig(iterations=2, seed=7, capacity_bytes=8 << 20, kill_after_s_min=0.1,
                          kill_after_s_max=0.12)

Records = list[tuple[int, bytes]]
Recovered = tuple[Records, int, float]
Damage = Callable[[Records, int], Records]


def _sabotage(monkeypatch: pytest.MonkeyPatch, damage: Damage) -> None:
    """Make the harness see ``damage(records, trim_offset)`` instead of what recovery returned."""
    honest = chaos_wal._recover

    def damaged(wal_path: Path, config: WALChaosConfig) -> Recovered:
        records, trim_offset, recovery_s = honest(wal_path, config)
        return damage(records, trim_offset), trim_offset, recovery_s

    monkeypatch.setattr(chaos_wal, "_recover", damaged)


def test_dropped_records_count_as_acknowledged_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _sabotage(monkeypatch, lambda records, trim: [])

    figures = _run(tmp_path, SABOTAGE)

    assert figures.acknowledged_lost > 0
    assert not figures.ok


def test_a_flipped_byte_counts_as_corrupt_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def flip_last(records: Records, trim: int) -> Records:
        if not records:
            return records
        offset, body = records[-1]
        return [*records[:-1], (offset, body[:-1] + bytes([body[-1] ^ 1]))]

    _sabotage(monkeypatch, flip_last)

    figures = _run(tmp_path, SABOTAGE)

    assert figures.corrupt_returned >= 1


def test_a_record_at_the_trim_counts_as_below_trim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def resurrect(records: Records, trim: int) -> Records:
        return [(trim, records[0][1]), *records] if records else records

    _sabotage(monkeypatch, resurrect)

    figures = _run(tmp_path, SABOTAGE)

    assert figures.below_trim_returned >= 1


def test_a_record_returned_twice_counts_as_duplicate_and_out_of_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sabotage(monkeypatch, lambda records, trim: [*records, *records[-1:]])

    figures = _run(tmp_path, SABOTAGE)

    assert figures.duplicate_returned >= 1
    assert figures.out_of_order_returned == figures.duplicate_returned


# The child's record bodies and its line protocol. --------------------------------------------------


def test_record_bodies_identify_their_writer_and_reject_any_change() -> None:
    seq = next(seq for seq in range(1000) if len(record_body(run_id=42, seq=seq)) > 100)
    body = record_body(run_id=42, seq=seq)
    filler = body[RECORD_PREFIX.size:]

    assert record_identity(body) == (42, seq)
    assert record_identity(body[:-1] + bytes([body[-1] ^ 0x80])) is None
    assert record_identity(RECORD_PREFIX.pack(seq, 43) + filler) is None, "another run's filler differs"
    assert record_identity(RECORD_PREFIX.pack(seq + 1, 42) + filler) is None
    assert record_identity(body + b"x") is None
    assert record_identity(body[:RECORD_PREFIX.size - 1]) is None


def test_record_sizes_span_a_few_bytes_to_64_kib() -> None:
    sizes = [len(record_body(run_id=1, seq=seq)) for seq in range(5000)]

    assert min(sizes) <= RECORD_PREFIX.size + 8
    assert max(sizes) > RECORD_PREFIX.size + FILLER_BYTES_MAX // 2
    assert max(sizes) <= RECORD_PREFIX.size + FILLER_BYTES_MAX
    assert record_body(run_id=1, seq=3) == record_body(run_id=1, seq=3)
    assert record_body(run_id=1, seq=3)[16:] != record_body(run_id=2, seq=3)[16:]


def test_child_output_is_decoded_and_a_line_cut_by_the_kill_is_dropped() -> None:
    report = parse_child_output(b"r 3 4096\na 5 100 30 40\nt+ 130\nt 130\nt+ 170\na 8 2")

    assert report.ready
    assert (report.records_recovered, report.last_recovered_offset) == (3, 4096)
    assert report.acks == [(5, 100), (6, 130), (7, 170)]
    assert report.trims_started == [130, 170]
    assert report.trims_done == [130]


# The command line. ---------------------------------------------------------------------------------


def test_chaos_wal_command_runs_and_prints_the_figures(tmp_path: Path) -> None:
    json_path = tmp_path / "figures.json"
    args = ["--iterations", "3", "--seed", "5", "--dir", str(tmp_path), "--capacity-mib", "8",
            "--json", str(json_path)]

    result = CliRunner().invoke(chaos_wal_command, args)

    assert result.exit_code == 0, result.output
    for label in ("records acknowledged", "records recovered", "acknowledged lost", "corrupt returned",
                  "below-trim returned"):
        assert label in result.output
    figures = json.loads(json_path.read_text())["figures"]
    assert figures["iterations"] == 3
    assert figures["ok"] is True
    assert figures["records_acknowledged"] > 0
    assert not list(tmp_path.glob("stratalog-chaos-wal-*")), "a clean run removes its WAL file"


def test_chaos_wal_command_exits_non_zero_when_a_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sabotage(monkeypatch, lambda records, trim: [])

    result = CliRunner().invoke(chaos_wal_command, ["--iterations", "2", "--dir", str(tmp_path),
                                                    "--capacity-mib", "8"])

    assert result.exit_code == 1, result.output
    assert "check(s) failed" in result.output
    assert list(tmp_path.glob("stratalog-chaos-wal-*/chaos.wal")), "a failed run keeps its WAL file"
