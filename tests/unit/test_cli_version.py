"""`cuda-agent` itself: --version answers like the `version` subcommand (the installed distribution's)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys


def test_version_flag_prints_the_installed_version() -> None:
    expected = importlib.metadata.version("cuda-agent")
    for flag in ("--version", "-V", "version"):
        done = subprocess.run(
            [sys.executable, "-m", "cuda_agent.cli", flag],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout.strip()) == (0, expected), (flag, done.stderr)
