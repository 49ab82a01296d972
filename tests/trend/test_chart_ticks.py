"""The trend chart's x axis labels whole steps, each under its own step: the step-30 marker
sits on the "30" label, not over a "29" placed at 29.4."""
import re

import numpy as np

from opdiff.trend.html import chart, step_ticks


def test_ticks_are_whole_round_steps_within_the_range():
    assert step_ticks(0, 59) == [0, 10, 20, 30, 40, 50]
    assert step_ticks(0, 4) == [0, 1, 2, 3, 4]
    assert step_ticks(3, 1000) == [200, 400, 600, 800, 1000]
    assert step_ticks(5, 5) == [5]


def test_the_marker_and_its_step_label_share_an_x():
    steps = np.arange(60)
    svg = chart("loss", [("target", steps, np.linspace(1, 2, 60), "#000")],
                [(30, "step 30: the runs part")])
    labels = {t: float(x) for x, t in re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="tick" '
                                                 r'text-anchor="middle">(\d+)</text>', svg)}
    marker = float(re.search(r'<line x1="([\d.]+)" x2="[\d.]+" y1="[\d.]+" y2="[\d.]+" '
                             r'stroke="[^"]+" stroke-width="1.5"', svg).group(1))
    assert "30" in labels and labels["30"] == marker
