"""`stratalog bench queues`: the command-line shell around :mod:`stratalog.bench.queues`."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn

from stratalog.bench import disk_reference
from stratalog.bench.common import MIB_BYTES, write_json
from stratalog.bench.queues_report import markdown_report, plot_rates, ratios_table, results_table, times
from stratalog.bench.tables import busy_at_start
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, table

QUEUES_DEFAULT = 1_000_000
MESSAGES_DEFAULT = 100_000_000
QUEUES_QUICK = 10_000
MESSAGES_QUICK = 200_000


def _progress(console: Console, plan: Any, names: list[str]) -> tuple[Progress, dict[tuple[str, str], TaskID]]:
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    progress = Progress(*columns, console=console, transient=True, refresh_per_second=2)
    totals = {"send": plan.total_messages, "index_check": plan.queues, "consume": consume_share_messages(plan)}
    tasks = {}
    for name in names:
        for phase in ("send", "index_check", "consume"):
            tasks[(name, phase)] = progress.add_task(f"{name}: {phase}", total=totals[phase])
    return progress, tasks


#: The consume phase goes on with further fifths of the queues until it has run this long, so that its rate
#: is not the start of a phase: at a million queues one fifth took 5.5 s.
CONSUME_S_MIN = 10.0


def consume_share_messages(plan: Any) -> int:
    """The messages of one share of the queues the consume phase reads."""
    from stratalog.bench.queues import CONSUME_SHARE

    messages: int = plan.rounds * max(1, int(plan.queues * CONSUME_SHARE))
    return messages


def _disk_table(system: dict[str, Any], message_bytes: int, rounds: int) -> Any:
    """stratalog's phases beside the disk references taken in the same run (ratios as in ratios_to_disk)."""
    out = table("stratalog against this disk, same run", ("phase", "phase rate", "disk reference", "reference rate",
                                                          "ratio"), left=("phase", "disk reference"))
    phases, ratios = system["phases"], system["ratios_to_disk"]
    reads, writes = system["reference"]["random_read_4k"], system["reference"]["seq_write"]
    if ratios.get("index_check"):
        label = (f"random 4 KiB reads, {reads['threads']} threads: {reads['reads']:,} in {reads['seconds']:.1f} s "
                 f"over {reads['files']} objects ({reads['file_bytes'] / MIB_BYTES:,.0f} MiB)")
        out.add_row("index check", f"{phases['index_check']['per_s']:,.0f} get/s", label,
                    f"{reads['per_s']:,.0f} reads/s", times(ratios["index_check"]))
        out.add_row("consume", f"{phases['consume']['per_s'] * message_bytes / MIB_BYTES:,.1f} MiB/s of messages",
                    "the same reads, in bytes", f"{reads['bytes_per_s'] / MIB_BYTES:,.1f} MiB/s",
                    times(ratios["consume"]))
        for phase, per, count in (("index_check", "get", phases["index_check"]["gets"]),
                                  ("consume", "queue", phases["consume"]["messages"] / rounds)):
            if f"{phase}_reads" in ratios:
                p = phases[phase]
                made = (f"{p['object_reads_per_s']:,.0f} reads/s ({p['object_reads'] / max(1, count):.2f} per {per}, "
                        f"{p['object_read_bytes'] / max(1, p['object_reads']) / 1024:.1f} KiB each; "
                        f"{p['object_reads_waited']:,} waited for the disk")
                if "disk_read_bytes" in p:
                    made += f", {p['disk_read_bytes'] / MIB_BYTES:,.0f} MiB read from it"
                made += ")"
                out.add_row(f"{phase.replace('_', ' ')}: its object reads", made, "random 4 KiB reads, as above",
                            f"{reads['per_s']:,.0f} reads/s", times(ratios[f"{phase}_reads"]))
    else:
        why = reads.get("skipped") or reads.get("error") or "no reads"
        out.add_row("index check, consume", "-", f"random 4 KiB reads: {why}", "-", "-")
    if ratios.get("send"):
        how = "O_DIRECT" if writes["direct"] else "buffered (O_DIRECT refused)"
        label = (f"sequential 1 MiB {how} writes + fdatasync: {writes['bytes'] / MIB_BYTES:,.0f} MiB in "
                 f"{writes['seconds']:.1f} s")
        out.add_row("send", f"{phases['send']['per_s']:,.0f} msg/s", label,
                    f"{writes['mib_per_s']:,.0f} MiB/s = {writes['messages_per_s']:,.0f} msg/s",
                    times(ratios["send"]))
    else:
        out.add_row("send", "-", f"sequential writes: {writes.get('error', 'no writes')}", "-", "-")
    return out


@click.command(name="queues")
@click.option("--queues", type=click.IntRange(min=1), default=None,
              help=f"Queues [default: {QUEUES_DEFAULT:,}; --quick: {QUEUES_QUICK:,}].")
@click.option("--messages", type=click.IntRange(min=1), default=None,
              help=f"Messages in all, rounded down to whole rounds [default: {MESSAGES_DEFAULT:,}; "
                   f"--quick: {MESSAGES_QUICK:,}].")
@click.option("--message-bytes", type=click.IntRange(min=8, max=1024), default=58, show_default=True)
@click.option("--threads", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Producer, checker and consumer threads.")
@click.option("--batch", type=click.IntRange(min=0), default=0, show_default=True,
              help="0: put per message; N: put_many of N messages (names as an Arrow string array for stratalog, "
                   "a list for the peers; messages as rows of a 2-D uint8 array).")
@click.option("--consume-batch", type=click.IntRange(min=1), default=100, show_default=True,
              help="Messages per get in the consume phase.")
@click.option("--consume-s-min", type=click.FloatRange(min=0), default=CONSUME_S_MIN, show_default=True,
              help="The consume phase reads a fifth of the queues, as the race does, then further fifths "
                   "(each queue at most once) until it has run this long; 0: one fifth.")
@click.option("--peers", is_flag=True, help="Also run rocksdict, lmdb, sqlite3 and NATS JetStream.")
@click.option("--only", default=None, help="Comma-separated systems to run (stratalog,rocksdict,lmdb,sqlite3,nats).")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the stores go [default: a temporary directory under the current directory].")
@click.option("--quick", is_flag=True, help=f"{QUEUES_QUICK:,} queues, {MESSAGES_QUICK:,} messages.")
@click.option("--reference-read-s", type=click.FloatRange(min=0, min_open=True), default=disk_reference.READ_S_MAX,
              show_default=True, help="stratalog's random-read reference stops after this long (or after as "
                                      "many reads as the index check made gets).")
@click.option("--reference-write-mib", type=click.IntRange(min=1), default=disk_reference.WRITE_BYTES // MIB_BYTES,
              show_default=True, help="MiB stratalog's sequential-write reference writes.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", multiple=True, metavar="JSON",
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Measure nothing: print these runs' tables and targets (from --json) as Markdown (repeatable).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --markdown-from: also plot each phase's rate per system as a PNG here (needs matplotlib).")
def queues(queues: int | None, messages: int | None, message_bytes: int, threads: int, batch: int,
           consume_batch: int, consume_s_min: float, peers: bool, only: str | None, dir_path: Path | None, quick: bool,
           reference_read_s: float, reference_write_mib: int, json_path: Path | None,
           markdown_from: tuple[Path, ...], plot_path: Path | None) -> None:
    """The 2018 Tianchi million-queue race: send, index check, consume; optionally on peers too.

    Each system runs in its own process. send: threads put round after round to their own queues, then
    flush (the phase ends when all is durable). index check: get(q, random offset, 10) on every queue.
    consume: 20% of the queues read in full, every message checked, then further fifths until the phase
    has run --consume-s-min.

    stratalog's read phases are bound by the disk, so the disk is measured beside them in the same run:
    random 4 KiB reads of the store's objects right after consume (same threads, same page cache), and
    1 MiB O_DIRECT writes plus fdatasync to a new file in its directory after close. The JSON's
    "reference" and "ratios_to_disk" hold them; a table sets each phase against them. The machine's
    speed at Python is measured too, after close: the bare put loop (a dict lookup of the name and a list
    append, one thread, 2 s), "reference.interpreter_put_loop": on a shared machine a slower send beside
    a slower loop is the machine, not the store.
    """
    if markdown_from:
        docs = [json.loads(p.read_text()) for p in markdown_from]
        click.echo(markdown_report(docs))
        if plot_path is not None:
            plot_rates(docs, plot_path)
        return
    from stratalog.bench.queues import SYSTEMS, QueueBenchPlan, ratios, run_in_process

    console = make_console()
    names = ["stratalog", *(SYSTEMS[1:] if peers else ())]
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = set(names) - set(SYSTEMS)
        if unknown:
            raise click.BadParameter(f"unknown systems: {', '.join(sorted(unknown))}", param_hint="--only")
    with bench_dir(dir_path) as target_dir:
        plan = QueueBenchPlan(
            queues=queues or (QUEUES_QUICK if quick else QUEUES_DEFAULT),
            messages=messages or (MESSAGES_QUICK if quick else MESSAGES_DEFAULT),
            message_bytes=message_bytes, threads=threads, batch=batch, consume_batch=consume_batch,
            consume_s_min=consume_s_min, dir_path=target_dir, reference_read_s_max=reference_read_s,
            reference_write_bytes=reference_write_mib * MIB_BYTES)
        machine = print_machine(console, target_dir)
        load_start = os.getloadavg()[0]
        busy = busy_at_start({"load_average_1m": {"start": load_start}, "machine": machine})
        if busy:
            console.print(f"[yellow]{busy}: the figures will say more about the machine than about the store[/]")
        results = []
        progress, tasks = _progress(console, plan, names)
        with progress:
            for name in names:
                def show(counts: list[int], name: str = name) -> None:
                    for phase, count in zip(("send", "index_check", "consume"), counts, strict=True):
                        progress.update(tasks[(name, phase)], completed=count)
                    share = consume_share_messages(plan)   # the consume bar fills once per share it reads
                    progress.update(tasks[(name, "consume")], total=share * max(1, -(-counts[2] // share)))

                results.append(run_in_process(name, plan, show))
    doc: dict[str, Any] = {
        "bench": "queues", "queues": plan.queues, "messages": plan.total_messages, "message_bytes": message_bytes,
        "threads": threads, "batch": batch, "consume_batch": consume_batch,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine,
        "systems": results, "ratios": ratios(results),
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
    }
    console.print(results_table([doc]).rich())
    if doc["ratios"]:
        console.print(ratios_table([doc]).rich())
    for s in results:
        if s["name"] == "stratalog" and "reference" in s:
            console.print(_disk_table(s, message_bytes, max(1, plan.total_messages // plan.queues)))
        if s["name"] == "stratalog" and "stats" in s:
            st = s["stats"]
            q = max(1, st["queues"])
            console.print(f"stratalog memory: index {st['index_bytes'] / q:.1f} B/queue "
                          f"({st['index_bytes'] / max(1, st['messages']):.2f} B/message, {st['objects']} objects), "
                          f"queue state {st['queue_state_bytes'] / q:.1f} B/queue, name dict "
                          f"{st['name_dict_bytes'] / q:.1f} B/queue, name index "
                          f"{st.get('name_index_bytes', 0) / q:.1f} B/queue")
            if "compactions" in st:
                sent = s.get("stats_after_send", {})
                console.print(f"stratalog merges: {st['compactions']} ({st['compacted_bytes'] / 2**30:.1f} GiB "
                              f"written), {sent.get('compactions', 0)} of them during send, "
                              f"{st.get('compactions_at_rest', 0)} at rest; objects after send "
                              f"{sent.get('objects', 0)}, at the end {st['objects']}; the largest merge "
                              f"worker's peak RSS {st.get('merge_worker_peak_rss_bytes', 0) / MIB_BYTES:,.0f} MiB")
            loop = s.get("reference", {}).get("interpreter_put_loop")
            if loop and s["mode"] == "put":
                console.print(f"interpreter reference, same run: the bare put loop (a dict lookup of the name, "
                              f"a list append) in one thread, {loop['per_s']:,.0f} puts/s; send with put is "
                              f"{s['phases']['send']['per_s'] / loop['per_s']:.2f}x of it")
            elif loop:
                console.print(f"interpreter reference, same run: the bare put loop in one thread, "
                              f"{loop['per_s']:,.0f} puts/s")
            r = s["recovery"]
            console.print(f"open after a clean close: {r['clean_open_seconds']:.2f} s; open after kill -9 with one "
                          f"more flushed message per queue in the WAL: {r['open_after_kill9_seconds']:.2f} s "
                          f"({r['objects']} object indexes, {r['index_bytes'] / MIB_BYTES:,.1f} MiB, read; "
                          f"{r['records_replayed']} WAL records, {r['messages_replayed']:,} messages replayed; "
                          f"no data read); flushed messages missing in sampled queues: "
                          f"{r['flushed_round_missing_in_sampled_queues']}")
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
