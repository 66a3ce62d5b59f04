"""The Toy lab's figures and page."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz import lab


def test_chance_is_a_legend_line_and_no_label_sits_on_the_curves():
    """Issue 14: the 'chance' label was drawn on the plot, where the loss curve (which sits at chance for its
    first steps) ran over it. Both loss charts draw chance as a dashed line at log(letters), named in the legend
    with its value, and put no text on the plot."""
    from attnviz.figures.lab import best_heads_curve, loss_curve

    chance = lab.chance_loss(8)
    assert chance == pytest.approx(math.log(8))
    losses = np.r_[np.full(50, chance), np.linspace(chance, 0.1, 50)]
    figs = [loss_curve(losses, chance, total_steps=100),
            best_heads_curve([10, 50, 100], [chance, chance, 0.1], {"induction": [0.1, 0.2, 0.9]}, chance,
                             total_steps=100)]
    for fig in figs:
        assert not fig.layout.annotations
        line = next(t for t in fig.data if t.name.startswith("chance"))
        assert f"{math.log(8):.2f} nats" in line.name and line.line.dash == "dash"
        np.testing.assert_allclose(line.y, [math.log(8)] * 2)
        assert list(line.x) == [0, 100]
        assert fig.layout.legend.y < 0  # under the plot, clear of the title
