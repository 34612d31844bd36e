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


def test_the_report_lists_lengths_in_order_whatever_order_they_were_given_in():
    """Lengths are evaluated, and kept in results.json, as given: with --lengths 96,48 the summary table and the
    examples read 96 before 48, while the grid table below them (and every figure) read 48 first."""
    grid = {"48": {"0.5": 1.0}, "96": {"0.5": 0.5}}
    results = {"lengths": [96, 48], "depths": [0.5], "tasks": ["passkey"], "samples": 2, "passkey_grid": grid,
               "passkey": {"96": 0.5, "48": 1.0}, "details": {"passkey": {"96": {"samples": 2}, "48": {"samples": 2}}},
               "examples": {"passkey": [{"length": L, "depth": 0.5, "answer": '12345"', "greedy": '12345"',
                                         "exact": True} for L in (96, 48)]}}  # fmt: skip
    report = markdown(results, {})
    for first, second in (("| 48 | 1.00 [", "| 96 | 0.50 ["), ("| 48 | 1.00 |", "| 96 | 0.50 |"),
                          ("| passkey | 48 |", "| passkey | 96 |")):  # summary, grid, examples
        assert report.index(first) < report.index(second), (first, second)
