"""The end-of-run report: the PPO trend ignores warm-up (demonstration) rewards, says "rose" only when a
trend test over several steps passes, and both files land next to the checkpoints and in the requested
directory."""

from __future__ import annotations

import json
from pathlib import Path

from cuda_agent.trainer.report import (
    CURVES_FILE,
    SUMMARY_FILE,
    StepRewards,
    reward_trend,
    run_summary,
    write_report,
)


def ppo(step: int, reward: float, std: float = 1.0, episodes: int = 8) -> dict[str, float | str]:
    return {"stage": "ppo", "step": step, "reward": reward, "reward_std": std, "episodes_learned": episodes,
            "pass_rate": 0.5}  # fmt: skip


HISTORY = [
    {"stage": "rft", "step": 1, "reward": 1.5, "pass_rate": 1.0, "nll_before": 10.8, "nll": 9.0},
    {"stage": "rft", "step": 2, "reward": 1.5, "pass_rate": 1.0, "nll": 7.0, "nll_after": 6.5},
    *(ppo(step, reward) for step, reward in enumerate([-1.0, -0.8, -0.9, 1.5, 1.8, 2.0], start=1)),
]


def test_trend_is_over_ppo_steps_only() -> None:
    summary = run_summary(HISTORY)
    assert summary["stages"]["rft"]["reward"] == [1.5, 1.5]
    assert summary["stages"]["ppo"]["step"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert (summary["ppo_reward_first"], summary["ppo_reward_last"]) == (-1.0, 2.0)
    assert summary["ppo_reward_rose"] is True
    assert summary["ppo_reward_trend"]["verdict"].startswith("rose")
    assert summary["warmup"]["rft"] == {"nll_before": 10.8, "nll_after": 6.5, "epochs": 2}


def test_trend_needs_several_steps_and_a_rise_beyond_the_spread() -> None:
    few = reward_trend([StepRewards(-1.0, 0.0, 8), StepRewards(3.0, 0.0, 8)])
    assert few["rose"] is None and "too few PPO steps" in few["verdict"]
    # Last step above the first, but within the noise of 4 episodes a step: not a rise.
    noisy = [StepRewards(m, 1.8, 4) for m in (-0.5, 0.5, 0.0, -0.2, 0.6, 0.3)]
    assert reward_trend(noisy)["rose"] is False
    assert reward_trend(noisy)["verdict"].startswith("did not rise")
    flat = reward_trend([StepRewards(-1.0, 0.0, 4)] * 6)
    assert flat["rose"] is False and "every episode of both windows earned -1" in flat["verdict"]
    clear = [StepRewards(m, 0.5, 8) for m in (-1.0, -0.9, -0.5, 0.5, 1.2, 1.4)]
    assert reward_trend(clear)["rose"] is True
    # The windows are a third of the steps: one early lucky step does not make a trend.
    assert (
        reward_trend([StepRewards(m, 1.0, 8) for m in (2.0, -1.0, -1.0, -1.0, -1.0, -0.9)])["rose"] is False
    )


def test_report_written_under_the_prefix_and_the_directory(tmp_path: Path) -> None:
    prefix, local = tmp_path / "checkpoints", tmp_path / "run"
    write_report(HISTORY, str(prefix), local)
    for directory in (prefix / "report", local):
        assert (directory / CURVES_FILE).read_bytes().startswith(b"\x89PNG")
        assert json.loads((directory / SUMMARY_FILE).read_text())["ppo_reward_rose"] is True
    write_report(HISTORY, str(tmp_path / "other"), None)
    assert (tmp_path / "other" / "report" / CURVES_FILE).exists()
