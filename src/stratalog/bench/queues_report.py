"""`stratalog bench queues`'s tables and targets, made from runs' JSON only: printed by each run, and for
several runs at once as Markdown for BENCHMARKS.md by `stratalog bench queues --markdown-from JSON ...`
(with `--plot`, each phase's rate per system as a PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stratalog.bench.common import MIB_BYTES
from stratalog.bench.tables import FigureTable, Verdict, provenance_lines, targets_table

#: The 2018 Tianchi million-queue race's bars, as the issue sets them for 2 cores, at 1 M queues x 100 M.
SEND_PUT_PER_S_MIN = 1_100_000
SEND_PUT_MANY_PER_S_MIN = 3_000_000
INDEX_CHECK_PER_S_MIN = 100_000
CONSUME_PER_S_MIN = 3_000_000
RSS_BYTES_MAX = 4 << 30
#: The scale the absolute targets are for; smaller runs are for the peers.
TARGET_QUEUES = 1_000_000
PEER_RATIO_TARGET = 3.0
PHASES = ("send", "index_check", "consume")


def times(ratio: float) -> str:
    """12.3x, 1.5x, 0.31x, 0.0041x: two significant digits below 1, where send's ratio often falls."""
    return f"{ratio:,.1f}x" if ratio >= 1 else f"{ratio:.2g}x"

#: Counts are printed in these units from these on.
KILO, MEGA = 1_000, 1_000_000


def _count(n: int) -> str:
    """1000000 -> "1 M", 100000 -> "100 k", 2500 -> "2.5 k", 200 -> "200"."""
    if n >= MEGA:
        return f"{n / MEGA:g} M"
    return f"{n / KILO:g} k" if n >= KILO else str(n)


def _scale(doc: dict[str, Any]) -> str:
    """Queues x messages, as "1 M x 100 M"."""
    return f"{_count(doc['queues'])} x {_count(doc['messages'])}"


def results_table(docs: Sequence[dict[str, Any]]) -> FigureTable:
    first = docs[0]
    out = FigureTable(f"Messages of {first['message_bytes']} B, {first['threads']} threads, a sync per thread at the "
                      "end of send, every message read checked",
                      ("queues x messages", "system", "mode", "send s", "send msg/s", "index s", "index get/s",
                       "consume s", "consume msg/s", "peak RSS MiB", "disk MiB", "ok"),
                      left=("queues x messages", "system", "mode"))
    for doc in docs:
        for s in doc["systems"]:
            if "phases" not in s:
                out.add(_scale(doc), s["name"], "-", *["-"] * 8, f"**{s.get('error', 'failed')}**")
                continue
            p = s["phases"]
            out.add(_scale(doc), s["name"], s["mode"], f"{p['send']['seconds']:.1f}", f"{p['send']['per_s']:,.0f}",
                    f"{p['index_check']['seconds']:.1f}", f"{p['index_check']['per_s']:,.0f}",
                    f"{p['consume']['seconds']:.1f}", f"{p['consume']['per_s']:,.0f}",
                    f"{s['peak_rss_bytes'] / MIB_BYTES:,.0f}", f"{s['disk_bytes'] / MIB_BYTES:,.0f}",
                    "yes" if s["ok"] else "**no**")
    return out


def ratios_table(docs: Sequence[dict[str, Any]]) -> FigureTable:
    out = FigureTable(f"stratalog over the fastest peer of the same run (target >= {PEER_RATIO_TARGET:g}x)",
                      ("queues x messages", "mode", "phase", "fastest peer", "ratio", ""),
                      left=("queues x messages", "mode", "phase", "fastest peer"))
    for doc in docs:
        mode = "put_many" if doc["batch"] else "put"
        for phase, r in doc["ratios"].items():
            out.add(_scale(doc), mode, phase, r["fastest_peer"], f"{r['ratio']:.2f}x",
                    Verdict(r["ratio"] >= PEER_RATIO_TARGET))
    return out


def _stratalog(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((s for s in doc["systems"] if s["name"] == "stratalog" and "phases" in s), None)


def disk_table(docs: Sequence[dict[str, Any]]) -> FigureTable:
    """stratalog's phases over the disk references of the same run (as the JSON's ratios_to_disk)."""
    out = FigureTable("stratalog over this disk and this interpreter, same run: gets/s over random 4 KiB reads/s of "
                      "the store's files; consumed bytes/s over those reads' bytes/s; send over what 1 MiB O_DIRECT "
                      "writes could take, and over the bare put loop (one thread); object reads per get and per "
                      "consumed queue",
                      ("queues x messages", "mode", "random reads/s", "index check", "consume", "write MiB/s", "send",
                       "put loop/s", "send", "reads/get", "reads/queue"),
                      left=("queues x messages", "mode"))
    for doc in docs:
        s = _stratalog(doc)
        if s is None or "ratios_to_disk" not in s:
            continue
        ratios, ref, p = s["ratios_to_disk"], s["reference"], s["phases"]
        reads, writes = ref.get("random_read_4k", {}), ref.get("seq_write", {})
        rounds = max(1, doc["messages"] // doc["queues"])
        per_get = p["index_check"].get("object_reads", 0) / max(1, p["index_check"].get("gets", 0))
        per_queue = p["consume"].get("object_reads", 0) / max(1, p["consume"].get("messages", 0) / rounds)
        loop = ref.get("interpreter_put_loop")
        out.add(_scale(doc), s["mode"], f"{reads['per_s']:,.0f}" if "per_s" in reads else reads.get("skipped", "-"),
                times(ratios["index_check"]) if ratios.get("index_check") else "-",
                times(ratios["consume"]) if ratios.get("consume") else "-",
                f"{writes['mib_per_s']:,.0f}" if "mib_per_s" in writes else "-",
                times(ratios["send"]) if ratios.get("send") else "-",
                f"{loop['per_s']:,.0f}" if loop else "-", times(p["send"]["per_s"] / loop["per_s"]) if loop else "-",
                f"{per_get:.2f}" if "object_reads" in p["index_check"] else "-",
                f"{per_queue:.2f}" if "object_reads" in p["consume"] else "-")
    return out


def recovery_table(docs: Sequence[dict[str, Any]]) -> FigureTable:
    out = FigureTable("stratalog's recovery and memory: open after a clean close, and after kill -9 with one more "
                      "flushed message per queue in the WAL (object indexes read, no data)",
                      ("queues x messages", "mode", "clean open s", "open after kill -9 s", "objects", "indexes MiB",
                       "messages replayed", "flushed missing", "index B/queue"),
                      left=("queues x messages", "mode"))
    for doc in docs:
        s = _stratalog(doc)
        if s is None or "recovery" not in s:
            continue
        r, st = s["recovery"], s.get("stats", {})
        out.add(_scale(doc), s["mode"], f"{r['clean_open_seconds']:.2f}", f"{r['open_after_kill9_seconds']:.2f}",
                f"{r['objects']:,}", f"{r['index_bytes'] / MIB_BYTES:,.1f}", f"{r['messages_replayed']:,}",
                f"{r['flushed_round_missing_in_sampled_queues']:,}",
                f"{st['index_bytes'] / max(1, st['queues']):,.0f}" if st else "-")
    return out


def targets(docs: Sequence[dict[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """The race's bars on the 1 M-queue runs, and the peer ratios of the runs with peers."""
    out: list[tuple[str, str, bool | None]] = []
    for doc in docs:
        s = _stratalog(doc)
        if s is None or doc["queues"] < TARGET_QUEUES:
            continue
        p, mode = s["phases"], s["mode"]
        send_min = SEND_PUT_MANY_PER_S_MIN if mode == "put_many" else SEND_PUT_PER_S_MIN
        for name, figure, bound in ((f"send with {mode} >= {send_min:,} msg/s", p["send"]["per_s"], send_min),
                                    (f"index check >= {INDEX_CHECK_PER_S_MIN:,} get/s ({mode} run)",
                                     p["index_check"]["per_s"], INDEX_CHECK_PER_S_MIN),
                                    (f"consume >= {CONSUME_PER_S_MIN:,} msg/s ({mode} run)", p["consume"]["per_s"],
                                     CONSUME_PER_S_MIN)):
            out.append((name, f"{figure:,.0f} ({figure / bound:.2f}x)", figure >= bound))
        rss = s["peak_rss_bytes"]
        out.append((f"peak RSS < {RSS_BYTES_MAX >> 30} GiB ({mode} run)", f"{rss / MIB_BYTES:,.0f} MiB",
                    rss < RSS_BYTES_MAX))
        if "recovery" in s:
            r = s["recovery"]
            out.append((f"recovery after kill -9 reads indexes only and loses no flushed message ({mode} run)",
                        f"{r['open_after_kill9_seconds']:.2f} s, {r['objects']} object indexes, "
                        f"{r['flushed_round_missing_in_sampled_queues']} missing",
                        r["flushed_round_missing_in_sampled_queues"] == 0))
    for doc in docs:
        if not doc["ratios"]:
            continue
        mode = "put_many" if doc["batch"] else "put"
        figures = ", ".join(f"{phase.replace('_', ' ')} {r['ratio']:.2f}x ({r['fastest_peer']})"
                            for phase, r in doc["ratios"].items())
        out.append((f"each phase >= {PEER_RATIO_TARGET:g}x the fastest peer ({_scale(doc)}, {mode})", figures,
                    all(r["ratio"] >= PEER_RATIO_TARGET for r in doc["ratios"].values())))
    return out


def markdown_report(docs: Sequence[dict[str, Any]]) -> str:
    """Every run's provenance, then the tables over all runs, then the targets (recovery and the ratios to
    the peers among them)."""
    found = targets(docs)
    every = [results_table(docs), disk_table(docs), *([targets_table(found)] if found else [])]
    return "\n".join([*provenance_lines(docs), "", *(t.markdown() for t in every if t.rows)])


def plot_rates(docs: Sequence[dict[str, Any]], path: Path) -> None:
    """Each phase's rate per system and run, on a log scale, the race's bars dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = {"send": SEND_PUT_PER_S_MIN, "index_check": INDEX_CHECK_PER_S_MIN, "consume": CONSUME_PER_S_MIN}
    fig, axes = plt.subplots(1, len(PHASES), figsize=(13, 4.5), sharey=False)
    for ax, phase in zip(axes, PHASES, strict=True):
        labels, values, colors = [], [], []
        for doc in docs:
            for s in doc["systems"]:
                if "phases" not in s:
                    continue
                labels.append(f"{s['name']} {s['mode']}\n{_count(doc['queues'])} queues")
                values.append(s["phases"][phase]["per_s"])
                colors.append("tab:blue" if s["name"] == "stratalog" else "tab:gray")
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(bars[phase], color="tab:red", linestyle="dashed", linewidth=0.8)
        ax.set_title(f"{phase.replace('_', ' ')} per s")
    fig.suptitle("Million queues: stratalog (blue) and peers (grey); dashed: the race's bar (put)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
