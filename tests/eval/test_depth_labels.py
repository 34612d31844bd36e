"""How the report and the heatmaps name a depth: as given, never rounded into another depth's label."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from minilm.eval.report import _heatmap_figure, markdown  # noqa: E402


def test_each_depth_is_labelled_as_given_in_the_heatmap_the_grid_table_and_the_examples():
    """Rounded to whole percents, depth 0.125 read 12 % and depths 0.001 and 0.004 were two rows both labelled
    0 % — a reader could not tell which row was which depth."""
    depths = [0.0, 0.001, 0.004, 0.125, 1.0]
    results = {"lengths": [64], "depths": depths, "tasks": ["passkey"], "samples": 2, "passkey": {"64": 0.5},
               "passkey_grid": {"64": {"0": 0.0, "0.001": 0.5, "0.004": 1.0, "0.125": 0.5, "1": 0.5}},
               "examples": {"passkey": [{"length": 64, "depth": 0.125, "answer": '12345"', "greedy": '12345"',
                                         "exact": True}]}}  # fmt: skip
    labels = ["0%", "0.1%", "0.4%", "12.5%", "100%"]
    fig = _heatmap_figure(results, "passkey")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == labels
    report = markdown(results, {})
    assert "| length | " + " | ".join(labels) + " |" in report
    assert "| 64 | 0.00 | 0.50 | 1.00 | 0.50 | 0.50 |" in report
    assert "| passkey | 64 | 12.5% |" in report
