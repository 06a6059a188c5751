"""curves.png (the trainer's end-of-run plot) has whole-number steps on its x axes, panel titles without
paths, and the stages' legend beside the panels, not over a curve. Checked on the matplotlib figure after a
draw (tick labels exist only then)."""

from __future__ import annotations

from typing import Any

from cuda_agent.trainer.report import curves_figure, run_summary

HISTORY: list[dict[str, Any]] = [
    {"stage": "rft", "step": 1, "reward": 1.5, "pass_rate": 1.0},
    {"stage": "rft", "step": 2, "reward": 1.5, "pass_rate": 1.0},
    *({"stage": "ppo", "step": s, "reward": r, "pass_rate": p} for s, r, p in [(1, -1.0, 0.0), (2, 1.0, 0.5),
                                                                               (3, 2.0, 0.75)]),
]  # fmt: skip


def test_steps_are_whole_numbers_and_the_legend_is_beside_the_panels() -> None:
    fig = curves_figure(run_summary(HISTORY))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    assert [ax.get_title() for ax in fig.axes] == ["reward", "pass rate"]
    for ax in fig.axes:
        low, high = ax.get_xlim()
        labels = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
        assert labels == ["1", "2", "3"], labels  # matplotlib's default here is 1.00, 1.25, ... 3.00
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["rft", "ppo"]
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        panel = ax.get_window_extent(renderer)
        assert box.x1 <= panel.x0 or panel.x1 <= box.x0 or box.y1 <= panel.y0 or panel.y1 <= box.y0
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
