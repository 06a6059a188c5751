"""The CUDA Agent release's workspace layout, judged as it stands (issue 30, part 2): its own binding.cpp
and binding_registry.h at the root, its utils/ harness, `REGISTER_BINDING(axpby, register_axpby)` with a
function that takes the module, `model.py` as the task. Through the real `cuda-agent judge` CLI on CPU.
tests/judge/release_workspace/README.md says what the files are."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixture_catalog import RunJudge

WORKSPACE = Path(__file__).with_name("release_workspace") / "cpu"


@pytest.mark.slow
def test_release_workspace_earns_a_reward_on_cpu(run_judge: RunJudge, tmp_path: Path) -> None:
    workspace = tmp_path / "agent_workdir"
    shutil.copytree(WORKSPACE, workspace)
    run = run_judge(workspace / "model.py", workspace, "cpu")
    report = run.report
    assert report["reward"] >= 1, report
    assert report["correct"] is True and report["violations"] == []
    notes = "\n".join(report["notes"])
    # The release's harness is the judge's side of the contract: removed with a note, never screened.
    assert "utils/ (__init__.py, compile.py, compile.sh, profiling.py, verification.py) removed" in notes
    assert "candidate's binding_registry.h replaced" in notes
    # What the user handed in is untouched (the judge works on a private copy).
    assert (workspace / "utils" / "compile.py").is_file()


def test_release_harness_is_removed_only_where_it_is_the_harness(tmp_path: Path) -> None:
    from cuda_agent.sandbox.judge import build

    workspace = tmp_path / "w"
    shutil.copytree(WORKSPACE, workspace)
    notes = build.remove_release_harness(workspace)
    assert len(notes) == 1 and not (workspace / "utils").exists()
    # A utils/ of the candidate's own (no harness file in it) stays, and so does one outside a workspace.
    (workspace / "utils").mkdir()
    (workspace / "utils" / "helpers.py").write_text("X = 1\n")
    assert build.remove_release_harness(workspace) == []
    assert (workspace / "utils" / "helpers.py").is_file()
    plain = tmp_path / "plain"
    (plain / "utils").mkdir(parents=True)
    (plain / "utils" / "compile.py").write_text("")
    assert build.remove_release_harness(plain) == []
