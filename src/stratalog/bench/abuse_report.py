"""`stratalog bench abuse`'s targets and its Markdown tables, computed from the run's JSON only, so a table in
BENCHMARKS.md cannot say anything the run did not measure (`stratalog bench abuse --markdown-from JSON`)."""

from __future__ import annotations

from typing import Any

from stratalog.bench.tables import markdown_table, provenance

#: "Other clients keep their latency": a phase's p99 at most this many times the baseline's p99 (same run).
#: Twice, not equal: on a 2-core machine the hostile process, the broker and the producer share the CPUs,
#: and the baseline's own p99 moves by tens of percent from one run to the next.
P99_RATIO_MAX = 2.0
#: "Keep their latency" also means no stall: no single produce of the good client waits longer than this
#: in any phase (the baseline's max is about 10-50 ms here; a stall of seconds hides below a p99).
STALL_MS_MAX = 1000.0


def _abuse_phases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in doc["phases"] if p["connections"]]


def _target(name: str, met: bool, text: str) -> dict[str, Any]:
    return {"name": name, "met": met, "figure_text": text}


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The good producer's p99 per abuse phase against the baseline's, memory against the budget, and the
    broker's answers: every one with its figure and verdict."""
    s = doc["settings"]
    out = []
    for p in _abuse_phases(doc):
        ratio = p.get("p99_over_baseline")
        text = (f"{ratio:.2f}x ({p['produce_ms']['p99']:.2f} ms against {doc['phases'][0]['produce_ms']['p99']:.2f})"
                if ratio is not None else "not measured")
        if p["error_count"]:
            text += f"; {p['error_count']} produce errors"
        out.append(_target(f"{p['name']}: p99 <= {P99_RATIO_MAX:g}x the baseline's", ratio is not None and
                           ratio <= P99_RATIO_MAX and not p["error_count"], text))
    stalled = [f"{p['name']} {p['produce_ms']['max'] / 1000:.1f} s" for p in doc["phases"]
               if p["produce_ms"]["samples"] and p["produce_ms"]["max"] > STALL_MS_MAX]
    timed_out = [f"{p['name']} {p['error_count']}" for p in doc["phases"] if p["error_count"]]
    worst_max = max((p["produce_ms"]["max"] for p in doc["phases"] if p["produce_ms"]["samples"]), default=0.0)
    text = f"longest: {', '.join(stalled)}" if stalled else f"longest {worst_max:.0f} ms"
    if timed_out:
        text += f"; not acknowledged in {doc['settings'].get('ack_wait_s', 30):g} s: {', '.join(timed_out)}"
    out.append(_target(f"no produce waits over {STALL_MS_MAX / 1000:g} s in any phase", not stalled and not timed_out,
                       text))
    peak = max((p["broker_rss_mib_peak"] for p in doc["phases"]), default=0.0)
    worst = max(doc["phases"], key=lambda p: p["broker_rss_mib_peak"], default=None)
    budget = s["memory_budget_mib"]
    out.append(_target(f"broker RSS <= {budget:,} MiB in every phase", peak <= budget and not any(
        p["aborted"] for p in doc["phases"]), f"{peak:,.0f} MiB at the peak ({worst['name'] if worst else '-'})"))
    down = [p["name"] for p in doc["phases"] if not p["broker_up"]]
    out.append(_target("the broker stays up and answers a new connection after every phase", not down,
                       "down after: " + ", ".join(down) if down else
                       f"answered after all {len(doc['phases'])} phases"))
    return out


def _table(heads: tuple[str, ...], rows: list[list[str]], left: int) -> list[str]:
    """A Markdown table whose first ``left`` columns are text."""
    return markdown_table(heads, rows, heads[:left])


def phase_cells(p: dict[str, Any]) -> list[str]:
    """A phase's row: connections, samples, p50/p99/p999/max, ratio, memory, sockets, log lines, up."""
    lat = p["produce_ms"]
    ramp = p.get("hostile", {}).get("ramp", {})
    conns = f"{ramp.get('connected', 0):,} of {p['connections']:,}" if p["connections"] else "0"
    figures = ([f"{lat[k]:.2f}" for k in ("p50", "p99", "p999", "max")] if lat["samples"] else ["-"] * 4)
    ratio = p.get("p99_over_baseline")
    return [p["name"], conns, f"{lat['samples']:,}", *figures, f"{ratio:.2f}x" if ratio is not None else "-",
            f"{p['broker_rss_mib_peak']:,.0f}", f"{p['broker_sockets_peak']:,}", f"{p['broker_log_lines']:,}",
            "yes" if p["broker_up"] else "**no**"]


PHASE_HEADS = ("phase", "hostile connections", "samples", "p50", "p99", "p99.9", "max", "p99 / baseline",
               "broker RSS MiB (peak)", "broker sockets (peak)", "broker log lines", "up")


def family_rows(doc: dict[str, Any]) -> list[list[str]]:
    """What the hostile process did in each single-family phase, as it counted it."""
    rows = []
    for p in _abuse_phases(doc):
        if len(p["families"]) != 1:
            continue
        report = p.get("hostile", {}).get("report", {})
        f = report.get("families", {}).get(p["name"])
        if not f:
            rows.append([p["name"], *["-"] * 7, report.get("error", "no report")])
            continue
        held = f"{f['held_s_max']:.1f}" if f["held_s_max"] is not None else "-"
        rows.append([p["name"], f"{f['opened']:,}", f"{f['actions']:,}", f"{f['closed_by_broker']:,}",
                     f"{f['not_closed']:,}", f"{f['connect_errors']:,}", held, f"{report.get('cpu_s', 0):.1f}",
                     f["first_error"]])
    return rows


FAMILY_HEADS = ("family", "opened", "actions", "closed by broker", "refused frame not closed", "connect errors",
                "longest held s", "hostile CPU s", "first error")


def markdown_report(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [provenance(doc), ""]
    lines += [f"One producer, {s['record_bytes']} B records one at a time at {s['rate_per_s']:g}/s, acks=all, for "
             f"{s['phase_s']:g} s per phase; latency in ms from the send call to the acknowledgement. Each abuse "
             f"phase: {s['connections']:,} hostile connections of one family (`all`: split between the families) "
             "from a separate process. Broker RSS: VmRSS sampled every 0.1 s.", ""]
    lines += _table(PHASE_HEADS, [phase_cells(p) for p in doc["phases"]], 2)
    lines += _table(("target", "measured", ""), [[t["name"], t["figure_text"], "met" if t["met"] else "**missed**"]
                                                 for t in targets(doc)], 2)
    return "\n".join(lines)
