"""The end-of-run report: the PPO trend ignores warm-up (demonstration) rewards, and both files land next
to the checkpoints and in the requested directory."""

from __future__ import annotations

import json
from pathlib import Path

from cuda_agent.trainer.report import CURVES_FILE, SUMMARY_FILE, run_summary, write_report

HISTORY = [
    {"stage": "rft", "step": 1, "reward": 1.5, "pass_rate": 1.0, "nll": 10.8},
    {"stage": "ppo", "step": 1, "reward": -1.0, "pass_rate": 0.0},
    {"stage": "ppo", "step": 2, "reward": 1.0, "pass_rate": 0.5},
]


def test_trend_is_over_ppo_steps_only() -> None:
    summary = run_summary(HISTORY)
    assert summary["stages"]["rft"]["reward"] == [1.5]
    assert summary["stages"]["ppo"]["step"] == [1.0, 2.0]
    assert (summary["ppo_reward_first"], summary["ppo_reward_last"], summary["ppo_reward_rose"]) == (
        -1.0,
        1.0,
        True,
    )
    assert run_summary(HISTORY[:2])["ppo_reward_rose"] is None


def test_report_written_under_the_prefix_and_the_directory(tmp_path: Path) -> None:
    prefix, local = tmp_path / "checkpoints", tmp_path / "run"
    write_report(HISTORY, str(prefix), local)
    for directory in (prefix / "report", local):
        assert (directory / CURVES_FILE).read_bytes().startswith(b"\x89PNG")
        assert json.loads((directory / SUMMARY_FILE).read_text())["ppo_reward_rose"] is True
    write_report(HISTORY, str(tmp_path / "other"), None)
    assert (tmp_path / "other" / "report" / CURVES_FILE).exists()
