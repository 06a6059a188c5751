"""`cuda-agent cluster` takes --name / --workdir before or after its subcommand (argparse parents), and a
subcommand without them keeps the value given before it. The subprocess case runs the real command against
a cluster directory that does not exist, so nothing is started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.localcluster.cli import _parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--name", "x", "--workdir", "/w", "status"],
        ["status", "--name", "x", "--workdir", "/w"],
        ["--name", "y", "status", "--name", "x", "--workdir", "/w"],  # the later one wins
        ["--workdir", "/w", "status", "--name", "x"],  # each option where the user put it
    ],
)
def test_options_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.command, args.name, args.workdir) == ("status", "x", Path("/w"))


def test_defaults_and_subcommand_options_stay_as_they_were() -> None:
    args = _parser().parse_args(["up", "--nodes", "2"])
    assert (args.name, args.workdir, args.nodes) == ("cuda-agent", None, 2)
    args = _parser().parse_args(["--name", "x", "up"])
    assert args.name == "x"  # not reset by the subcommand's copy of the option


def test_the_command_reads_an_option_given_after_the_subcommand(tmp_path: Path) -> None:
    def cluster(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cuda_agent.cli", "cluster", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    result = cluster("kubeconfig", "--name", "ghost", "--workdir", str(tmp_path))
    assert result.returncode == 1
    assert "cluster 'ghost' does not exist" in result.stderr
    result = cluster("status", "--json", "--workdir", str(tmp_path), "--name", "ghost")
    assert result.returncode == 1
    assert json.loads(result.stdout)["name"] == "ghost"
    assert json.loads(result.stdout)["exists"] is False
