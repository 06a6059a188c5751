"""The judge zygote keeps the outcomes of inductor's CPU ISA checks per host (server/judge_zygote.
_warm_cpu_isa): a later zygote on the same host does not run a check already answered there (each is a
build plus a `python -c "import torch"` subprocess: ~40 s for the 10 checks of an AMX host on 2 cores),
and inductor's own probe code runs unchanged on the kept outcomes, so the ISA list and each ISA's build
flags are the same, failures included; a file others may write is not believed. Each case is a fresh
process (inductor caches the probe per process). There, the check itself is replaced by a recorder with a
chosen outcome, so the cases show which checks ran without paying for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASE = """
import json, sys
from pathlib import Path
from torch._inductor import cpu_vec_isa
from cuda_agent.sandbox.server import judge_zygote

ran = []
failing = set(json.loads(sys.argv[2]))
def check_build(self, code):
    ran.append(str(self))
    return str(self) not in failing
cpu_vec_isa.VecISA.check_build = check_build
judge_zygote._warm_cpu_isa(Path(sys.argv[1]))
isas = cpu_vec_isa.valid_vec_isa_list()
print(json.dumps({"ran": ran, "isas": [[str(isa), isa.build_arch_flags()] for isa in isas]}))
"""


def _zygote_warm_up(answers: Path, failing: tuple[str, ...] = ()) -> dict[str, list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", CASE, str(answers), json.dumps(list(failing))],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found: dict[str, list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_kept_outcomes_replace_the_checks_and_give_the_same_isas(tmp_path: Path) -> None:
    answers = tmp_path / "isa"
    first = _zygote_warm_up(answers)
    if not first["ran"]:
        pytest.skip("inductor checks no vector ISA on this machine")
    [kept] = list(answers.iterdir())
    assert kept.stat().st_mode & 0o077 == 0
    second = _zygote_warm_up(answers)
    assert second["ran"] == []
    assert second["isas"] == first["isas"]


def test_a_failed_check_is_kept_as_failed_and_an_answer_others_may_write_is_ignored(tmp_path: Path) -> None:
    answers = tmp_path / "isa"
    first = _zygote_warm_up(answers, failing=("avx2",))
    if "avx2" not in first["ran"]:
        pytest.skip("inductor does not check avx2 on this machine")
    assert "avx2" not in [name for name, _ in first["isas"]]  # type: ignore[misc]
    again = _zygote_warm_up(answers)  # a check would pass now; the kept failure is what this host said
    assert again["ran"] == []
    assert again["isas"] == first["isas"]

    [kept] = list(answers.iterdir())
    os.chmod(kept, 0o666)
    planted = _zygote_warm_up(answers)
    assert set(planted["ran"]) == set(first["ran"])  # checked as before
    assert "avx2" in [name for name, _ in planted["isas"]]  # type: ignore[misc]
