"""`stratalog bench kafka`'s targets and its Markdown report, both computed from the run's JSON only, so a
table in BENCHMARKS.md cannot say anything the run did not measure (`stratalog bench kafka --markdown-from JSON`)."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import size_label
from stratalog.bench.tables import FigureTable, markdown_table, provenance

#: The targets: stratalog alone, and against each peer (as factors).
P99_MS_MAX_256 = 1.5
PRODUCE_MB_PER_S_MIN_100 = 500.0
PRODUCE_MSG_PER_S_MIN_100 = 1_000_000.0
CONSUME_TAIL_MB_PER_S_MIN = 1000.0
NATS_FACTOR_MIN = 3.0
TANSU_FACTOR_MIN = 0.5
#: The transactional targets: a transactional produce that commits every 100 ms keeps 0.8x the plain
#: produce's rate of the same run, and a read_committed tail read of those transactions 0.9x the
#: read_uncommitted one's.
TXN_PRODUCE_FACTOR_MIN = 0.8
READ_COMMITTED_FACTOR_MIN = 0.9
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
    return out + transactional_targets(mine)


def _ok_rate(d: dict[str, Any] | None) -> float | None:
    """A phase's msg/s if it took every message (a rate over a timeout is not comparable)."""
    rate = (d or {}).get("msg_per_s")
    return float(rate) if rate and (d or {}).get("ok") else None


def _over(top: dict[str, Any] | None, bottom: dict[str, Any] | None) -> tuple[float, float, float] | None:
    """``top``'s rate over ``bottom``'s, with both rates; None unless both took every message."""
    a, b = _ok_rate(top), _ok_rate(bottom)
    return (a / b, a, b) if a is not None and b is not None else None


def txn_ratios(r: dict[str, Any]) -> dict[str, tuple[float, float, float] | None]:
    """A throughput size's transactional ratios: transactional and idempotent produce over the plain one,
    transactional over idempotent, and the read_committed tail read over the read_uncommitted one."""
    txn = r.get("transactional", {})
    tail = txn.get("consume_tail", {})
    return {"produce": _over(txn.get("produce"), r.get("produce")),
            "idempotent": _over(txn.get("produce_idempotent"), r.get("produce")),
            "txn_over_idempotent": _over(txn.get("produce"), txn.get("produce_idempotent")),
            "read": _over(tail.get("read_committed"), tail.get("read_uncommitted"))}


def transactional_targets(mine: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The two transactional targets, each met only if met at every throughput size (the lowest ratio is the
    figure; a size without both rates leaves it unmeasured); none for a run from before the transactional
    phases (the kept kafka-check runs)."""
    sizes = [r for r in (mine or {}).get("throughput", []) if "commit_interval_ms" in r.get("transactional", {})]
    if mine is not None and not sizes:
        return []
    interval = next((r["transactional"]["commit_interval_ms"] for r in sizes if "transactional" in r), None)
    every = f"a commit every {interval:g} ms" if interval is not None else "transactions"
    out = []
    for key, name, bound, unit in (
            ("produce", f"transactional produce ({every}) >= {TXN_PRODUCE_FACTOR_MIN:g}x the plain produce, "
                        "each size", TXN_PRODUCE_FACTOR_MIN, "msg/s"),
            ("read", f"read_committed tail consume >= {READ_COMMITTED_FACTOR_MIN:g}x read_uncommitted, each size",
             READ_COMMITTED_FACTOR_MIN, "msg/s")):
        found = [(r["message_bytes"], txn_ratios(r)[key]) for r in sizes]
        parts = [f"{size_label(size)}: {x[0]:.2f}x ({x[1]:,.0f} vs {x[2]:,.0f} {unit})" if x is not None
                 else f"{size_label(size)}: not measured" for size, x in found]
        whole = bool(found) and all(x is not None for _, x in found)
        figure = min(x[0] for _, x in found if x is not None) if whole else None
        target = _target(name, figure, bound, True, "; ".join(parts))
        if found:  # which size lacks its figures, rather than "not measured" alone
            target["figure_text"] = "; ".join(parts)
        out.append(target)
    return out


TXN_HEADS = ("peer", "size", "produced", "commits", "time in flush", "time in EndTxn", "transactional msg/s",
             "transactional / plain", "idempotent msg/s", "idempotent / plain",
             "producers' CPU µs/msg: plain, idempotent, transactional", "broker's CPU µs/msg: the same", "tail read",
             "read_uncommitted msg/s", "read_committed msg/s", "committed / uncommitted", "note")


def _factor(x: tuple[float, float, float] | None) -> str:
    return f"{x[0]:.2f}x" if x is not None else "-"


def _msgs(d: dict[str, Any] | None) -> str:
    return f"{d['msg_per_s']:,.0f}" if d and "msg_per_s" in d else "-"


def _cpu(runs: list[dict[str, Any]], key: str) -> str:
    """Each produce run's CPU time per message, µs, in order ("-" for a run that has none)."""
    return ", ".join(f"{r[key]:.1f}" if r.get(key) is not None else "-" for r in runs)


def _share(produce: dict[str, Any], key: str) -> str:
    return f"{produce[key]:.0%}" if key in produce else "-"


def _txn_notes(txn: dict[str, Any]) -> list[str]:
    """Errors and shortfalls of the transactional phases, and reads not from where meant."""
    notes: list[str] = []
    tail = txn.get("consume_tail", {})
    phases = [("transactional produce", txn.get("produce", {})),
              ("idempotent produce", txn.get("produce_idempotent", {})),
              *((f"{level} read", tail[level]) for level in ("read_uncommitted", "read_committed") if level in tail)]
    tail_run = txn.get("tail_run", {})
    if "produce" in tail_run:
        phases.insert(0, ("transactional tail run", tail_run["produce"]))
    for what, d in phases:
        notes += [f"{what}: {x}" for x in (d.get("error"), *d.get("errors", [])) if x]
        if d.get("aborted"):
            notes.append(f"{what}: {d['aborted']:,} messages in aborted transactions")
    if tail.get("error"):
        notes.append(f"tail read: {tail['error']}")
    if tail_run and not tail_run.get("is_produce_run"):
        notes.append(f"tail run: a topic of its own ({tail_run['messages']:,} messages)")
    if tail.get("from_log_cache") is False:
        notes.append("an upload ran during the tail reads: part came from objects")
    return notes


def transactional_table(doc: dict[str, Any]) -> FigureTable:
    """The transactional phases per size, beside the plain produce of the same run; one row for each peer
    they do not run against, saying why."""
    sizes = [r for p in doc["peers"] if p["status"] == "ran" for r in p["throughput"]
             if "commit_interval_ms" in r.get("transactional", {})]
    interval = f"{sizes[0]['transactional']['commit_interval_ms']:g} ms" if sizes else "-"
    counts = sorted({len(r["transactional"].get("consume_tail", {}).get("read_committed", {}).get("reads", []))
                     for r in sizes})
    reads = "-" if not counts else str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]} to {counts[-1]}"
    out = FigureTable(
        f"Transactions: the plain throughput producers, each with a transactional.id, a transaction committed "
        f"every {interval} (librdkafka's commit_transaction first flushes: waits for every message of it to be "
        "acknowledged; the time in each part is the share of the producers' time); idempotent: the same producers "
        "with enable.idempotence=true and no transactions. CPU: the producer processes' (librdkafka's threads "
        "included) and the broker's CPU time over each run, per message. Tail read: a transactional run of at most "
        "half the broker's upload threshold read back at once at each isolation level, in rounds (the order "
        "alternating) while one more ends before the broker's upload interval: each level's rate is the median "
        f"of its reads ({reads} each)", TXN_HEADS, left=("peer", "size", "note"))
    for peer in doc["peers"]:
        if peer["status"] != "ran":
            continue
        skipped = [r["transactional"] for r in peer["throughput"] if "not_applicable" in r.get("transactional", {})]
        if skipped:  # one row for the peer: the reason is the same at every size
            out.add(peer["name"], "-", *["-"] * (len(TXN_HEADS) - 3), f"not run: {skipped[0]['not_applicable']}")
        for r in peer["throughput"]:
            if "commit_interval_ms" in r.get("transactional", {}):
                out.add(*_txn_row(peer["name"], r))
    return out


def _txn_row(peer: str, r: dict[str, Any]) -> list[str]:
    txn = r["transactional"]
    produce, tail = txn.get("produce", {}), txn.get("consume_tail", {})
    ratios = txn_ratios(r)
    runs = [r.get("produce", {}), txn.get("produce_idempotent", {}), produce]
    return [peer, size_label(r["message_bytes"]), f"{produce.get('committed', 0):,}",
            f"{produce.get('transactions', 0):,}", _share(produce, "flush_share"), _share(produce, "end_txn_share"),
            _msgs(produce), _factor(ratios["produce"]), _msgs(txn.get("produce_idempotent")),
            _factor(ratios["idempotent"]), _cpu(runs, "producer_cpu_us_per_msg"), _cpu(runs, "server_cpu_us_per_msg"),
            f"{tail.get('read_committed', {}).get('messages', 0):,}",
            _msgs(tail.get("read_uncommitted")), _msgs(tail.get("read_committed")), _factor(ratios["read"]),
            "; ".join(_txn_notes(txn))]


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


def consumer_text(doc: dict[str, Any]) -> str:
    """Which isolation level the plain phases' Kafka consumer read with, as the run recorded it."""
    levels = {r["consume_tail"]["isolation_level"] for p in doc["peers"] for r in p.get("throughput", [])
              if "isolation_level" in r.get("consume_tail", {})}
    if not levels:
        return "The Kafka consumer's isolation.level was not recorded (librdkafka's default: read_committed)."
    return (f"The Kafka consumer reads with isolation.level={', '.join(sorted(levels))} (librdkafka's default is "
            "read_committed; over topics without transactions both levels read the same records).")


def cpu_split_text(doc: dict[str, Any]) -> str:
    """The run's CPU split (``--server-cpus``) as a sentence with a space after it; nothing without one."""
    split = doc["settings"].get("cpu_split")
    if not split:
        return ""
    servers, clients = (", ".join(str(c) for c in split[k]) for k in ("server_cpus", "client_cpus"))
    return (f"Each server ran on vCPU {servers} alone and every client process on vCPU {clients} "
            "(`--server-cpus`), in every phase. ")


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
              f"after the upload (the first read of it from objects; NATS: after the same wait). {consumer_text(doc)} "
              f"{cpu_split_text(doc)}MB = 10^6 bytes.", ""]
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
    txn = transactional_table(doc)
    if txn.rows:  # a run from before the transactional phases has none
        lines += [txn.markdown(), ""]
    lines += _table(("target", "measured", ""), [[t["name"], t["figure_text"], "met" if t["met"] else "**missed**"]
                                                 for t in targets(doc)], 2)
    return "\n".join(lines)
