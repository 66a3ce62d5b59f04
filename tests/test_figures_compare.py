"""attnviz.figures.compare: two models of different shapes on one chart."""

import numpy as np

from attnviz.figures import compare as F


def test_distributions_drop_nan_and_label_the_axes():
    fig = F.distributions({"a": [0.1, np.nan, 0.3], "b": [0.5]}, title="t", y_title="entropy (nats)")
    assert [list(t.y) for t in fig.data] == [[0.1, 0.3], [0.5]]
    assert fig.data[0].name == "a (2)" and fig.layout.yaxis.title.text == "entropy (nats)"
    assert fig.layout.xaxis.title.text


def test_depth_curves_mark_the_kinds_of_layer():
    fig = F.depth_curves({"deep": ([0, 0.5, 1], [1, 2, 3], ["local", "global", "local"]),
                          "flat": ([0, 1], [2, 2], None)}, title="t", y_title="share")
    assert list(fig.data[0].marker.symbol) == ["triangle-up", "circle", "triangle-up"]
    assert fig.data[1].marker.symbol == "circle"
    assert {t.name for t in fig.data[2:]} == {"global layer", "local layer"}  # the legend of the two shapes
    assert "relative depth" in fig.layout.xaxis.title.text and fig.layout.yaxis.title.text == "share"
