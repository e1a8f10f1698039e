"""`stratalog bench kafka`'s targets and its Markdown report, both computed from the run's JSON only, so a
table in BENCHMARKS.md cannot say anything the run did not measure (`stratalog bench kafka --markdown-from JSON`)."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import size_label
from stratalog.bench.tables import markdown_table, provenance

#: The targets: stratalog alone, and against each peer (as factors).
P99_MS_MAX_256 = 1.5
PRODUCE_MB_PER_S_MIN_100 = 500.0
PRODUCE_MSG_PER_S_MIN_100 = 1_000_000.0
CONSUME_TAIL_MB_PER_S_MIN = 1000.0
NATS_FACTOR_MIN = 3.0
TANSU_FACTOR_MIN = 0.5
LATENCY_KEYS = ("p0", "p50", "p90", "p99", "p99_9", "p99_99", "p99_9999", "max")
LATENCY_HEADS = ("p0", "p50", "p90", "p99", "p99.9", "p99.99", "p99.9999", "max")


def _peer(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((p for p in doc["peers"] if p["name"] == name and p["status"] == "ran"), None)


def _latency(peer: dict[str, Any] | None, size: int, key: str) -> float | None:
    for r in (peer or {}).get("latency", []):
        if r["message_bytes"] == size and r.get("produce_ms", {}).get("samples"):
            value: float = r["produce_ms"][key]
            return value
    return None


def _rate(peer: dict[str, Any] | None, size: int, phase: str, key: str) -> float | None:
    for r in (peer or {}).get("throughput", []):
        if r["message_bytes"] == size and key in r.get(phase, {}):
            value: float = r[phase][key]
            return value
    return None


def _best_tail(peer: dict[str, Any] | None) -> tuple[float, int] | None:
    """The highest tail-read MB/s over the sizes, with its size."""
    found = [(r["consume_tail"]["mb_per_s"], r["message_bytes"]) for r in (peer or {}).get("throughput", [])
             if "mb_per_s" in r.get("consume_tail", {})]
    return max(found) if found else None


def _target(name: str, figure: float | None, bound: float, at_least: bool, text: str) -> dict[str, Any]:
    met = figure is not None and (figure >= bound if at_least else figure <= bound)
    return {"name": name, "figure": figure, "bound": bound, "at_least": at_least, "met": met,
            "figure_text": text if figure is not None else "not measured"}


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with stratalog's figure and its verdict; relative targets as factors over the peer."""
    mine, nats, tansu = _peer(doc, "stratalog"), _peer(doc, "nats"), _peer(doc, "tansu")
    disk_p99 = doc.get("disk_reference", {}).get("produce_ms", {}).get("p99")
    p99 = _latency(mine, 256, "p99")
    mb = _rate(mine, 100, "produce", "mb_per_s")
    msgs = _rate(mine, 100, "produce", "msg_per_s")
    tail = _best_tail(mine)
    disk_text = f"; the disk's own p99 in the same run: {disk_p99:.2f} ms" if disk_p99 is not None else ""
    out = [
        _target(f"produce p99 <= {P99_MS_MAX_256:g} ms at 256 B, fsync always", p99, P99_MS_MAX_256, False,
                f"{p99 or 0:.2f} ms{disk_text}"),
        _target(f">= {PRODUCE_MB_PER_S_MIN_100:g} MB/s of 100 B produced, acks=all", mb, PRODUCE_MB_PER_S_MIN_100,
                True, f"{mb or 0:,.1f} MB/s"),
        _target(f">= {PRODUCE_MSG_PER_S_MIN_100:,.0f} msg/s of 100 B produced, acks=all", msgs,
                PRODUCE_MSG_PER_S_MIN_100, True, f"{msgs or 0:,.0f} msg/s"),
        _target("consume >= 1 GB/s from the tail", tail[0] if tail else None, CONSUME_TAIL_MB_PER_S_MIN, True,
                f"{tail[0]:,.1f} MB/s ({size_label(tail[1])})" if tail else ""),
    ]
    for name, peer, factor in (("NATS JetStream", nats, NATS_FACTOR_MIN), ("Tansu (no disk)", tansu, TANSU_FACTOR_MIN)):
        theirs_p99 = _latency(peer, 256, "p99")
        theirs_msgs = _rate(peer, 100, "produce", "msg_per_s")
        theirs_tail = _rate(peer, tail[1], "consume_tail", "mb_per_s") if tail else None
        what = f">= {factor:g}x {name}" if factor >= 1 else f"within {factor:g}x of {name}"
        # Latency: lower is better, so the factor is theirs over ours.
        for label, ours, theirs, invert, unit in (
                ("256 B produce p99", p99, theirs_p99, True, "ms"),
                ("100 B produce msg/s", msgs, theirs_msgs, False, "msg/s"),
                (f"tail consume MB/s ({size_label(tail[1]) if tail else '-'})", tail[0] if tail else None,
                 theirs_tail, False, "MB/s")):
            factor_of = None
            if ours and theirs:
                factor_of = theirs / ours if invert else ours / theirs
            digits = 2 if unit == "ms" else 0
            text = (f"{factor_of:.2f}x (stratalog {ours:,.{digits}f} vs {theirs:,.{digits}f} {unit})"
                            if factor_of is not None else "")
            out.append(_target(f"{label} {what}", factor_of, factor, True, text))
    return out


def throughput_notes(r: dict[str, Any]) -> list[str]:
    """What a throughput row's figures need said beside them: errors, and reads not from where meant."""
    notes: list[str] = []
    for phase in ("produce", "consume_tail", "consume_cold"):
        d = r.get(phase, {})
        notes += [x for x in (d.get("error"), *d.get("errors", [])) if x]
        if d.get("ok") is False and d.get("messages", 0) < d.get("expected", 0):
            notes.append(f"{phase.replace('_', ' ')}: {d['messages']:,} of {d['expected']:,} in {d['seconds']:.0f} s, "
                         "rate not comparable")
    tail_run = r.get("tail_run", {})
    if tail_run and not tail_run.get("is_produce_run"):
        notes.append(f"tail run: a topic of its own ({tail_run['messages']:,} messages)")
    if r.get("consume_tail", {}).get("from_log_cache") is False:
        notes.append("an upload ran during the tail read: part came from objects")
    if r.get("consume_cold", {}).get("uploaded_before_read") is False:
        notes.append("not yet uploaded at the cold read")
    return notes


def recompressed_row(peer: str, r: dict[str, Any]) -> list[str] | None:
    """The produce run into a topic whose compression.type makes the broker recompress every batch, as a
    throughput row: its rate, and the rate over the plain run's (None: the run has none)."""
    run = r.get("produce_recompressed")
    if run is None:
        return None
    plain = r.get("produce", {}).get("msg_per_s")
    codec = run.get("topic_configs", {}).get("compression.type", "a codec")
    notes = [x for x in (run.get("error"), *run.get("errors", [])) if x]
    if plain and run.get("msg_per_s"):
        ratio = run["msg_per_s"] / plain
        notes.insert(0, f"every batch recompressed into {codec}: {ratio:.2f}x the plain produce rate")
    return [f"{peer}, compression.type={codec}", size_label(r["message_bytes"]), f"{run.get('messages', 0):,}",
            *_rate_cells(run), "-", "-", "-", "-", "-", "; ".join(notes)]


def _table(heads: tuple[str, ...], rows: list[list[str]], left: int) -> list[str]:
    """A Markdown table whose first ``left`` columns are text."""
    return markdown_table(heads, rows, heads[:left])


#: BENCHMARKS.md's latency columns; the JSON holds p0 to p99.9999, and `--plot` draws them all.
REPORT_LATENCY_KEYS = ("p50", "p90", "p99", "p99_9", "max")
REPORT_LATENCY_HEADS = ("p50", "p90", "p99", "p99.9", "max")


def _latency_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Produce latency per peer and size, its p99 over the disk's, and end-to-end p50 and p99."""
    rows = []
    blank = [""] * (len(REPORT_LATENCY_KEYS) + 3)
    disk = doc.get("disk_reference", {}).get("produce_ms", {})
    disk_p99 = disk.get("p99") if disk.get("samples") else None
    if disk_p99 is not None:
        rows.append([doc["disk_reference"]["name"], "4 KiB", f"{disk['samples']:,}",
                     *(f"{disk[k]:.2f}" for k in REPORT_LATENCY_KEYS), "1.00x", "-", "-"])
    for peer in doc["peers"]:
        if peer["status"] != "ran":
            rows.append([peer["name"], "skipped", "", *blank])
            continue
        for r in peer["latency"]:
            lat, e2e = r.get("produce_ms", {}), r.get("end_to_end_ms", {})
            if not lat.get("samples"):
                rows.append([peer["name"], size_label(r["message_bytes"]), "0", *["-"] * len(blank)])
                continue
            over = f"{lat['p99'] / disk_p99:.2f}x" if disk_p99 else "-"
            ends = [f"{e2e[k]:.2f}" for k in ("p50", "p99")] if e2e.get("samples") else ["-", "-"]
            rows.append([peer["name"], size_label(r["message_bytes"]), f"{lat['samples']:,}",
                         *(f"{lat[k]:.2f}" for k in REPORT_LATENCY_KEYS), over, *ends])
    return rows


def _rate_cells(d: dict[str, Any]) -> list[str]:
    if "not_applicable" in d:
        return ["n/a", "n/a"]
    if "msg_per_s" not in d:
        return ["-", "-"]
    return [f"{d['msg_per_s']:,.0f}", f"{d['mb_per_s']:,.1f}"]


def markdown_report(doc: dict[str, Any]) -> str:
    """One run as Markdown: latency (beside the disk's, and end to end), throughput, and the targets (with
    the ratios to the peers they are about)."""
    s = doc["settings"]
    lines = [provenance(doc), ""]
    lines += [f"Produce latency, ms: one producer at {s['rate_per_s']:g} msg/s for {s['duration_s']:g} s per size, "
             "acks=all, linger.ms=0, from the send call to the acknowledgement. The disk row: the same rate, "
             "one 4 KiB O_DIRECT + O_DSYNC `pwrite` each, on the bare disk under the data directory, before the "
             "servers started. End to end: from the send call to a consumer beside the producer receiving it.", ""]
    lines += _table(("peer", "size", "samples", *REPORT_LATENCY_HEADS, "p99 / disk p99", "end-to-end p50",
                     "end-to-end p99"), _latency_rows(doc), 2)
    lines += [f"Throughput: {s['producers']} producer processes, acks=all, linger.ms={s['linger_ms']}, batch.size "
              f"{s['batch_bytes'] >> 20} MiB (NATS: publish_async, 4,000 in flight). Tail: a run of at most half the "
              "broker's upload threshold read back at once, from the log cache; cold: the same topic read again "
              "after the upload (the first read of it from objects; NATS: after the same wait). MB = 10^6 bytes.",
              ""]
    rows = []
    for peer in doc["peers"]:
        if peer["status"] != "ran":
            continue
        for r in peer["throughput"]:
            p, t, c = r.get("produce", {}), r.get("consume_tail", {}), r.get("consume_cold", {})
            rows.append([peer["name"], size_label(r["message_bytes"]), f"{p.get('messages', 0):,}", *_rate_cells(p),
                         f"{t.get('messages', 0):,}", *_rate_cells(t), *_rate_cells(c),
                         "; ".join(throughput_notes(r))])
            if (extra := recompressed_row(peer["name"], r)) is not None:
                rows.append(extra)
    lines += _table(("peer", "size", "produced", "produce msg/s", "produce MB/s", "tail read", "tail msg/s",
                     "tail MB/s", "cold msg/s", "cold MB/s", "note"), rows, 2)
    lines += _table(("target", "measured", ""), [[t["name"], t["figure_text"], "met" if t["met"] else "**missed**"]
                                                 for t in targets(doc)], 2)
    return "\n".join(lines)
