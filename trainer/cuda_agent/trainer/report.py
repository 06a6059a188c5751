"""The end-of-run report: reward / pass-rate curves (PNG) and a JSON summary, from the trainer's history.

Written into the trainer's working directory (the run directory under the local executor) and next to the
checkpoints in storage, so `cuda-agent demo` and a cluster user find the same files.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from cuda_agent.storage import join_uri, open_store

CURVES_FILE = "curves.png"
SUMMARY_FILE = "summary.json"
CURVE_METRICS = ("reward", "pass_rate")


def run_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-stage series of the curve metrics, and whether PPO reward rose from its first to its last step.

    Warm-up steps train on demonstrations, so their reward is the demonstrations', not the policy's: the
    trend is taken over PPO steps only."""
    series: dict[str, dict[str, list[float]]] = {}
    for entry in history:
        stage = str(entry["stage"])
        for key in ("step", *CURVE_METRICS):
            if key in entry:
                series.setdefault(stage, {}).setdefault(key, []).append(float(entry[key]))
    rewards = series.get("ppo", {}).get("reward", [])
    rose = None if len(rewards) < 2 else rewards[-1] > rewards[0]
    return {"stages": series, "ppo_reward_first": rewards[0] if rewards else None,
            "ppo_reward_last": rewards[-1] if rewards else None, "ppo_reward_rose": rose}  # fmt: skip


def plot_curves(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display in pods or CI
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(CURVE_METRICS), figsize=(10, 3.5))
    for axis, metric in zip(axes, CURVE_METRICS, strict=True):
        for stage, values in summary["stages"].items():
            if metric in values and "step" in values:
                axis.plot(values["step"], values[metric], marker="o", label=stage)
        axis.set_xlabel("step of the stage")
        axis.set_title(metric.replace("_", " "))
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.tight_layout()
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
