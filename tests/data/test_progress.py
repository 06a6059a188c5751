"""`cuda-agent data synth` off a terminal (a log, `kubectl logs`, a pipe) prints one progress line per N
samples instead of tqdm's carriage-return bar, which such a reader shows as nothing or one growing line."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from cuda_agent.data.cli import LineProgress

QUICK = "composed,no_stochastic_ops,runs_eager,deterministic,nontrivial_output"


def test_a_line_each_time_the_count_passes_a_multiple() -> None:
    stream = io.StringIO()
    with LineProgress(total=12, description="accepted", every=5, stream=stream) as progress:
        for k in (3, 3, 0, 3, 3):  # batches of newly accepted samples, as synth.run reports them
            progress.update(k)
    counts = [line.split()[1] for line in stream.getvalue().splitlines()]
    assert counts == ["0/12", "6/12", "12/12"]  # start, past 5, past 10; the end line is not repeated


def test_synth_piped_prints_progress_lines(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "cuda_agent.cli", "data", "synth", "--n", "4", "--out", str(tmp_path / "out"),
        "--seed", "2", "--batch-size", "2", "--no-transformers", "--filters", QUICK, "--progress-every", "2",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("accepted ")]
    assert lines[0].split()[1] == "0/4" and lines[-1].split()[1] == "4/4", lines
    assert len(lines) >= 3  # at least one line in between, every 2 accepted samples
    assert "\r" not in result.stderr
