"""The end-of-run report: reward / pass-rate curves (PNG) and a JSON summary, from the trainer's history.

Written into the trainer's working directory (the run directory under the local executor) and next to the
checkpoints in storage, so `cuda-agent demo` and a cluster user find the same files.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuda_agent.storage import join_uri, open_store

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CURVES_FILE = "curves.png"
SUMMARY_FILE = "summary.json"
CURVE_METRICS = ("reward", "pass_rate")


# A trend needs a first and a last window of at least this many PPO steps each.
TREND_WINDOW_MIN = 2
# The last window's mean must exceed the first's by this many standard errors of the difference.
TREND_Z = 2.0


@dataclass(frozen=True)
class StepRewards:
    """One PPO step's episode rewards, summarised: mean, population standard deviation, count."""

    mean: float
    std: float
    episodes: int


def _pooled(steps: Sequence[StepRewards]) -> tuple[float, float, int]:
    """Mean, variance and count of the episode rewards of several steps together."""
    n = sum(s.episodes for s in steps)
    mean = sum(s.mean * s.episodes for s in steps) / n
    second = sum((s.std**2 + s.mean**2) * s.episodes for s in steps) / n
    return mean, max(second - mean**2, 0.0), n


def reward_trend(steps: Sequence[StepRewards]) -> dict[str, Any]:
    """Did reward rise over the PPO steps? The episodes of the first k steps against those of the last k
    (k = a third of the steps, at least TREND_WINDOW_MIN): "rose" only when the last window's mean beats
    the first's by more than TREND_Z standard errors of the difference (Welch's statistic on episode
    rewards). Every other outcome says why in words: too few steps, no episode, or no rise."""
    steps = [s for s in steps if s.episodes > 0]
    k = max(TREND_WINDOW_MIN, len(steps) // 3)
    if len(steps) < 2 * k:
        return {
            "verdict": f"too few PPO steps for a trend: {len(steps)} with episodes, need {2 * k}",
            "rose": None,
        }
    m1, v1, n1 = _pooled(steps[:k])
    m2, v2, n2 = _pooled(steps[-k:])
    se = math.sqrt(v1 / n1 + v2 / n2)
    rose = m2 - m1 > TREND_Z * se and m2 > m1
    result: dict[str, Any] = {
        "window_steps": k,
        "first_mean": m1,
        "last_mean": m2,
        "standard_error": se,
        "rose": rose,
    }
    if rose:
        result["verdict"] = (
            f"rose: {m1:.3f} -> {m2:.3f} over the first and last {k} steps (> {TREND_Z:g} s.e. {se:.3f})"
        )
    elif v1 == v2 == 0 and m1 == m2:
        result["verdict"] = f"did not rise: every episode of both windows earned {m1:g}"
    else:
        result["verdict"] = (
            f"did not rise: {m1:.3f} -> {m2:.3f} over the first and last {k} steps "
            f"(needs > {TREND_Z:g} s.e. = {TREND_Z * se:.3f})"
        )
    return result


def run_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-stage series of the curve metrics, the warm-up stages' fits (NLL, explained variance before and
    after), and the PPO reward trend test.

    Warm-up steps train on demonstrations, so their reward is the demonstrations', not the policy's: the
    trend is taken over PPO steps only."""
    series: dict[str, dict[str, list[float]]] = {}
    for entry in history:
        stage = str(entry["stage"])
        for key in ("step", *CURVE_METRICS):
            if key in entry:
                series.setdefault(stage, {}).setdefault(key, []).append(float(entry[key]))
    ppo = [h for h in history if h["stage"] == "ppo" and "reward" in h]
    steps = [
        StepRewards(float(h["reward"]), float(h.get("reward_std", 0.0)), int(h.get("episodes_learned", 1)))
        for h in ppo
    ]
    trend = reward_trend(steps)
    rewards = [s.mean for s in steps]
    return {
        "stages": series,
        "warmup": _warmup_fits(history),
        "ppo_reward_first": rewards[0] if rewards else None,
        "ppo_reward_last": rewards[-1] if rewards else None,
        "ppo_reward_trend": trend,
        "ppo_reward_rose": trend["rose"],
    }


WARMUP_FITS = (("rft", "nll"), ("value_pretraining", "explained_variance"))


def stage_fit(history: list[dict[str, Any]], stage: str, key: str) -> dict[str, float] | None:
    """How far a warm-up stage moved its fit: the first `<key>_before`, the last `<key>_after` (or `<key>`)
    and the epochs run; None before the stage has both."""
    entries = [h for h in history if h["stage"] == stage]
    before = next((h[f"{key}_before"] for h in entries if f"{key}_before" in h), None)
    after = next((h.get(f"{key}_after", h.get(key)) for h in reversed(entries)), None)
    if before is None or after is None:
        return None
    return {f"{key}_before": float(before), f"{key}_after": float(after), "epochs": len(entries)}


def _warmup_fits(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """RFT's NLL and value pretraining's explained variance: first value before, last value after."""
    fits = {stage: stage_fit(history, stage, key) for stage, key in WARMUP_FITS}
    return {stage: fit for stage, fit in fits.items() if fit is not None}


def curves_figure(summary: dict[str, Any]) -> Figure:
    """One panel per curve metric, one line per stage. Steps are whole numbers, so the x ticks are too
    (matplotlib's default locator puts 1.25, 1.5 ... between three steps). The stages' legend sits to the
    right of the panels, never over a curve."""
    import matplotlib

    matplotlib.use("Agg")  # no display in pods or CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(CURVE_METRICS), figsize=(10, 3.5), layout="constrained")
    for axis, metric in zip(axes, CURVE_METRICS, strict=True):
        for stage, values in summary["stages"].items():
            if metric in values and "step" in values:
                axis.plot(values["step"], values[metric], marker="o", label=stage)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("step of the stage")
        axis.set_title(metric.replace("_", " "))
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside right upper", fontsize="small", title="stage")
    return figure


def plot_curves(summary: dict[str, Any], path: Path) -> None:
    figure = curves_figure(summary)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(history: list[dict[str, Any]], prefix: str, directory: Path | None) -> dict[str, Any]:
    """Writes curves.png and summary.json under `prefix`/report (and into `directory` when given)."""
    summary = run_summary(history)
    with tempfile.TemporaryDirectory() as scratch:
        local = directory or Path(scratch)
        local.mkdir(parents=True, exist_ok=True)
        (local / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        plot_curves(summary, local / CURVES_FILE)
        for name in (CURVES_FILE, SUMMARY_FILE):
            key = join_uri(prefix, f"report/{name}")
            open_store(key).put_bytes(key, (local / name).read_bytes())
    return summary
