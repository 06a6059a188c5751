"""eval's plots read as a person expects: speedup ticks "0.5x / 1x / 2x", legends beside the axes (not over
bars), and titles that name what was evaluated without this machine's absolute paths. Checked on the
matplotlib figures that plot() saves, after a draw (tick labels exist only then)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cuda_agent.eval.models import EvalConfig, TaskResult
from cuda_agent.eval.report import build_report, levels_figure, plot_label, speedup_ticks, speedups_figure


def row(key: str, reward: int, eager: float | None = None, compile_: float | None = None) -> TaskResult:
    level, task = key.split("/")
    fields: dict[str, Any] = {"key": key, "level": level, "task": task, "reward": reward}
    fields |= {"compiled": reward > 0, "correct": reward > 0, "speedup_eager": eager}
    return TaskResult.model_validate({**fields, "speedup_compile": compile_})


ROWS = [row("level1/a", 3, 2.4, 1.3), row("level1/b", 2, 1.1, 0.7), row("level2/c", 1, 0.6, 0.4),
        row("level2/d", -1)]  # fmt: skip


def overlaps(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def test_speedup_axis_is_ticked_in_x_and_the_legend_is_off_the_data() -> None:
    fig = speedups_figure(ROWS)
    fig.canvas.draw()
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert labels and all(label.endswith("x") for label in labels), labels
    assert "1x" in labels and "2x" in labels and "0.5x" in labels, labels
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]  # no 10^-1 style
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = ax.get_legend()
    assert legend is not None
    assert not overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
    box = legend.get_window_extent(renderer)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1  # beside the axes, yet inside the saved image


def test_levels_title_has_no_absolute_path_and_the_legend_is_off_the_bars(tmp_path: Path) -> None:
    solutions = tmp_path / "deep" / "my-solutions"
    cfg = EvalConfig(tasks="t", out_dir=tmp_path, solutions=solutions, device="cuda", fast_p=[0.0, 1.0])
    report = build_report(cfg, ROWS, evaluated=4, wall_s=10.0, gpus=1)
    assert report.source == str(solutions)  # the report itself keeps the full path
    fig = levels_figure(report)
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_title() == "solutions: my-solutions (cuda)"
    assert str(tmp_path) not in ax.get_title()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = ax.get_legend()
    assert legend is not None
    assert not overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


@pytest.mark.parametrize(
    ("source", "label"),
    [
        ("/home/me/runs/solutions", "solutions"),
        ("replay:/tmp/x/script.jsonl", "replay:script.jsonl"),
        ("hf:/srv/models/smollm2", "hf:smollm2"),
        ("hf:HuggingFaceTB/SmolLM2-135M-Instruct", "hf:HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("s3://bucket/solutions", "s3://bucket/solutions"),
        ("openai:http://127.0.0.1:8000/v1", "openai:http://127.0.0.1:8000/v1"),
    ],
)
def test_plot_label(source: str, label: str) -> None:
    assert plot_label(source) == label


def test_speedup_ticks() -> None:
    assert speedup_ticks(0.4, 3.0) == [0.5, 1.0, 2.0]
    assert speedup_ticks(0.9, 30.0) == [1.0, 2.0, 5.0, 10.0, 20.0]
    assert speedup_ticks(0.01, 500.0) == [0.01, 0.1, 1.0, 10.0, 100.0]  # wide: whole decades only
