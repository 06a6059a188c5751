"""The milestone reward of the paper's eq. 1, as a table."""

from __future__ import annotations

import pytest

from cuda_agent.api.judge import milestone_reward


@pytest.mark.parametrize(
    ("compiled", "correct", "violations", "eager", "compile_", "reward"),
    [
        (False, False, [], None, None, -1),
        (True, False, [], 2.0, 2.0, -1),
        (True, True, ["torch-compute: aten::mm"], 2.0, 2.0, -1),
        (True, True, [], 1.2, 1.2, 3),
        (True, True, [], 1.06, 1.051, 3),
        (True, True, [], 1.2, 1.05, 2),  # exactly 5 % faster is not "more than 5 %"
        (True, True, [], 1.2, 0.5, 2),
        (True, True, [], 1.2, None, 2),  # no compile timing: at most 2
        (True, True, [], 1.05, 2.0, 1),  # faster than compile only is still 1
        (True, True, [], 0.5, 0.5, 1),
        (True, True, [], None, None, 1),
    ],
)
def test_milestone_reward(
    compiled: bool,
    correct: bool,
    violations: list[str],
    eager: float | None,
    compile_: float | None,
    reward: int,
) -> None:
    got = milestone_reward(
        compiled=compiled,
        correct=correct,
        violations=violations,
        speedup_eager=eager,
        speedup_compile=compile_,
    )
    assert got == reward


def test_margin_is_configurable() -> None:
    kwargs = {
        "compiled": True,
        "correct": True,
        "violations": [],
        "speedup_eager": 1.08,
        "speedup_compile": 1.08,
    }
    assert milestone_reward(**kwargs, margin=0.05) == 3  # type: ignore[arg-type]
    assert milestone_reward(**kwargs, margin=0.10) == 1  # type: ignore[arg-type]
