"""Line plots as inline SVG, drawn on the server: no script, no plotting library in the page.

A plot is a polyline over the series' time span, with its largest value and the span written on it; a
series of fewer than two points says it has no data yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 160
#: A line needs two points.
POINTS_MIN = 2
#: Room for the labels inside the plot's box.
MARGIN_TOP, MARGIN_BOTTOM, MARGIN_SIDE = 16, 18, 6


def line_plot(points: Sequence[tuple[float, float]], unit: str, title: str) -> str:
    """An ``<svg>`` element plotting ``points`` (seconds, value): every text in it is escaped."""
    label = escape(title)
    head = (f'<svg class="plot" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" class="plot-box"/>'
            f'<text x="{MARGIN_SIDE}" y="12" class="plot-title">{label}</text>')
    if len(points) < POINTS_MIN:
        return head + f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle">no data yet</text></svg>'
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span_x, span_y = WIDTH - 2 * MARGIN_SIDE, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    xy = " ".join(f"{MARGIN_SIDE + (t - t0) / ((t1 - t0) or 1) * span_x:.1f},"
                  f"{MARGIN_TOP + (1 - v / top) * span_y:.1f}" for t, v in points)
    minutes = (t1 - t0) / 60
    return (head + f'<polyline fill="none" class="plot-line" points="{xy}"/>'
            f'<text x="{WIDTH - MARGIN_SIDE}" y="12" text-anchor="end">max {top:,.1f} {escape(unit)}</text>'
            f'<text x="{MARGIN_SIDE}" y="{HEIGHT - 4}">{minutes:.1f} min ago</text>'
            f'<text x="{WIDTH - MARGIN_SIDE}" y="{HEIGHT - 4}" text-anchor="end">now</text></svg>')
