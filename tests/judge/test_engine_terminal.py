"""What the person at the terminal sees: phase lines as the orchestrator reports them, and a verdict line
that says in plain words why a candidate was refused."""

from __future__ import annotations

import io

from cuda_agent.api.judge import JudgeVerdict, Speedups, TimingTriple
from cuda_agent.sandbox.judge import cli


def events() -> list[dict[str, object]]:
    out: list[dict[str, object]] = [
        {"phase": "screen", "elapsed_s": 0.1},
        {"phase": "build", "elapsed_s": 0.2},
    ]
    out += [{"phase": "verify", "done": i, "total": 5, "elapsed_s": 9.0 + i} for i in range(6)]
    # the worker's relayed counts, then the orchestrator's own end of the phase (the same 100/100)
    out += [{"phase": "profile", "done": d, "total": 100, "elapsed_s": 15.0} for d in (0, 50, 100, 100)]
    return out


def test_progress_on_a_pipe_prints_one_line_per_phase_and_its_end() -> None:
    stream = io.StringIO()
    progress = cli.Progress(stream)
    for event in events():
        progress(event)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == [
        "screen",
        "build",
        "verify",
        "verify",
        "profile",
        "profile",
    ]
    assert lines[0].startswith("[   0.1 s] screen")
    assert "[" + "#" * 24 + "] 5/5 trials" in lines[3]
    assert "] 0/100 timed trials" in lines[4] and "100/100 timed trials" in lines[5]


def test_progress_on_a_terminal_redraws_the_bar_in_place() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress = cli.Progress(stream)
    for event in events():
        progress(event)
    progress.close()
    text = stream.getvalue()
    assert text.count("\n") == 4  # one line per phase: screen, build, verify, profile
    assert "50/100 timed trials" in text and text.endswith("\n")


def test_a_refusal_says_so_instead_of_correct_false() -> None:
    refused = JudgeVerdict(
        compiled=True,
        violations=["torch-compute: aten::sigmoid"],
        timings_ms=TimingTriple(candidate=0.1, eager=0.2),
        speedup=Speedups(eager=2.0),
    )
    text = cli._summary(refused)
    assert text.splitlines()[0].startswith(
        "reward -1: refused (torch-compute): PyTorch computes part of the result"
    )
    assert "correct not scored (refused)" in text and "correct False" not in text
    passed = JudgeVerdict(reward=2, compiled=True, correct=True, speedup=Speedups(eager=1.5, compile=0.9))
    assert cli._summary(passed).splitlines()[0] == "reward 2: faster than eager"
    unbuilt = JudgeVerdict(error="model_new.py defines no ModelNew class (found before the build)")
    assert cli._summary(unbuilt).splitlines()[0] == (
        "reward -1: not built: model_new.py defines no ModelNew class (found before the build)"
    )
