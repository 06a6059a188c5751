"""One judge-options path: the session server passes a run's JudgeOptions to the judge as that model's JSON
(`--options-json`), and a person's flags build the same model; the judge's CLI code turns either into the
run's JudgeConfig in one place (judge/config.judge_config). End to end, where the options arrive: in
tests/sandbox/test_sandbox_api.py, tests/agent/test_episode_contract.py, tests/sandbox/test_real_judge.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.api.judge import OPTIONS_JSON_FLAG, JudgeOptions, Timeouts, Tolerances
from cuda_agent.sandbox.judge import cli
from cuda_agent.sandbox.judge.config import JudgeConfig, ProfileSettings
from cuda_agent.sandbox.server.judge_runner import QUICK_PROFILE, stage_options

OPTIONS = JudgeOptions(
    trials=7, precision="tf32", compile_mode="max-autotune", timeout_s=600, atol=0.003, rtol=0.004,
    profile_trials=50, margin=0.2,
)  # fmt: skip
FLAGS = [
    "--trials", "7", "--precision", "tf32", "--compile-mode", "max-autotune", "--timeout", "600",
    "--atol", "0.003", "--rtol", "0.004", "--profile-trials", "50", "--margin", "0.2",
]  # fmt: skip


def config_of(*argv: str) -> JudgeConfig:
    return cli.build_config(cli.parse_args(["task.py", "model_new.py", *argv]), "cpu")


def test_the_servers_json_and_a_persons_flags_build_the_same_config() -> None:
    from_json = config_of(OPTIONS_JSON_FLAG, OPTIONS.model_dump_json(exclude_none=True))
    assert from_json == config_of(*FLAGS)
    assert (from_json.trials, from_json.precision, from_json.compile_mode, from_json.margin) == (
        7, "tf32", "max-autotune", 0.2,
    )  # fmt: skip
    assert from_json.tolerances == Tolerances(atol=0.003, rtol=0.004)
    assert from_json.timeouts == Timeouts(total=600, build=600, verify=300, profile=600)
    assert from_json.profile == ProfileSettings(trials=50)


def test_no_options_keep_every_judge_default() -> None:
    expected = JudgeConfig(task=Path("task.py").resolve(), candidate=Path("model_new.py").resolve())
    assert config_of() == expected
    assert config_of(OPTIONS_JSON_FLAG, "{}") == expected


def test_options_json_is_the_whole_set_and_is_checked_by_the_contract() -> None:
    with pytest.raises(ValueError, match="--options-json cannot be combined with --trials, --timeout"):
        config_of(OPTIONS_JSON_FLAG, "{}", "--trials", "3", "--timeout", "60")
    with pytest.raises(ValueError, match="invalid --options-json margin: Input should be less than or equal"):
        config_of(OPTIONS_JSON_FLAG, '{"margin": 2}')
    with pytest.raises(ValueError, match="invalid --options-json tolerance: Extra inputs are not permitted"):
        config_of(OPTIONS_JSON_FLAG, '{"tolerance": 0.1}')
    # A person's flags are bounded by JudgeConfig alone, as before the one path (e.g. --margin 1000).
    assert config_of("--margin", "1000").margin == 1000


def test_the_stages_options_are_the_sessions_with_the_quick_profile() -> None:
    assert stage_options("profile", OPTIONS) == OPTIONS
    verify = stage_options("verify", OPTIONS)
    assert verify == OPTIONS.model_copy(update=QUICK_PROFILE)
    assert stage_options("compile", OPTIONS) == verify.model_copy(update={"trials": 1})
    assert stage_options("profile", JudgeOptions()).model_dump_json(exclude_none=True) == "{}"


def test_every_precision_a_trainingrun_may_ask_for_is_one_the_judge_runs() -> None:
    """The CRD's enum (spec.reward.precision) and the judge's value list are two spellings of one list: the
    episode contract's mapping covers the enum and lands on the judge's values, all of them."""
    from cuda_agent.api.episode import JUDGE_PRECISION
    from cuda_agent.api.judge import PRECISIONS
    from cuda_agent.api.trainingrun import PrecisionPolicy

    assert set(JUDGE_PRECISION) == set(PrecisionPolicy)
    assert sorted(JUDGE_PRECISION.values()) == sorted(PRECISIONS)
