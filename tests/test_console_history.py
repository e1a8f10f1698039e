"""The console's plots without a browser: the history's rates and levels, its bounds, and the SVG it draws."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stratalog.console import history as history_module
from stratalog.console.history import History
from stratalog.console.plots import line_plot
from stratalog.console.views import Formats, assignment
from stratalog.errors import StratalogError


def test_a_counter_is_plotted_as_its_rate_and_a_level_as_it_is() -> None:
    h = History()
    for t, produced, lag in [(0.0, 0, 9), (5.0, 50, 4), (10.0, 50, 0), (15.0, 80, 2)]:
        h.record(("produced", "t"), produced, t)
        h.record(("lag", "g"), lag, t)
    assert h.series(("produced", "t")) == [(5.0, 10.0), (10.0, 0.0), (15.0, 6.0)]
    assert h.latest_rate(("produced", "t")) == 6.0
    assert h.series(("lag", "g")) == [(0.0, 9), (5.0, 4), (10.0, 0), (15.0, 2)]
    assert h.latest_rate(("produced", "unknown")) is None


def test_a_series_keeps_its_window_and_the_history_its_count_of_series(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_module, "SERIES_MAX", 3)
    h = History()
    points = int(history_module.WINDOW_S / history_module.SAMPLE_S) + 1
    for i in range(points + 10):
        h.record(("lag", "a"), i, float(i))
    assert len(h.series(("lag", "a"))) == points and h.series(("lag", "a"))[0] == (10.0, 10)
    for name in "bcd":
        h.record(("lag", name), 1, 0.0)
    assert h.series(("lag", "d")) == [] and h.dropped == 1
    h.forget([("lag", "a")])
    h.record(("lag", "d"), 1, 0.0)
    assert h.series(("lag", "d")) == [(0.0, 1)]


def test_a_plot_draws_its_points_and_escapes_its_labels() -> None:
    svg = line_plot([(0.0, 0.0), (60.0, 10.0), (120.0, 5.0)], "records/s", "<lag> & more")
    [points] = re.findall(r'points="([^"]+)"', svg)
    xs = [float(p.split(",")[0]) for p in points.split()]
    assert xs == sorted(xs) and len(xs) == 3
    assert "&lt;lag&gt; &amp; more" in svg and "<lag>" not in svg
    assert "max 10.0 records/s" in svg and "2.0 min ago" in svg
    assert "no data yet" in line_plot([(0.0, 1.0)], "records", "lag")


def test_values_are_shown_as_text_json_or_hex_and_long_ones_cut() -> None:
    assert Formats("json").show(b'{"a":[1,2]}') == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert Formats("json").show(b"not json \xff") == "not json \\xff"
    assert Formats("hex").show(b"\x00\xff") == "00 ff"
    assert Formats("text").show(None) is None
    shown = Formats("text").show(b"x" * 2500)
    assert shown is not None and shown.endswith("... (500 more characters)")


def test_a_consumer_assignment_is_read_and_any_other_bytes_give_none() -> None:
    # version 0; one topic "t" with partitions 2 and 0; no user data
    data = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x02" + \
        b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff"
    assert assignment(data) == [("t", 0), ("t", 2)]
    assert assignment(b"") == [] and assignment(b"\x00\x00\x7f\xff\xff\xff") == []


@given(st.binary(max_size=256))
def test_any_bytes_a_client_sends_as_its_assignment_are_read_or_refused_quietly(data: bytes) -> None:
    found = assignment(data)
    assert all(isinstance(topic, str) and isinstance(partition, int) for topic, partition in found)


def test_a_sample_that_fails_is_logged_once_and_sampling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class Offsets:
        calls = 0

        def groups(self) -> list[str]:
            self.calls += 1
            if self.calls <= 2:
                raise StratalogError("the offsets' database is out of reach")
            return []

        def fetch(self, group: str) -> dict[object, object]:
            return {}

    offsets = Offsets()
    broker: Any = SimpleNamespace(offsets=offsets, topics=SimpleNamespace(all=list), end_offset_of=lambda t, p: 0)

    async def sample_four_times() -> None:
        task = asyncio.create_task(History().run(broker, interval_s=0))
        while offsets.calls < 4:
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(sample_four_times())
    warnings = [r for r in caplog.records if "missed a sample" in r.getMessage()]
    assert len(warnings) == 1, "two failures in a row, one line"
