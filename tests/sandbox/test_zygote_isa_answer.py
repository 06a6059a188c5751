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
judge_zygote._warm_cpu_isa(None if sys.argv[1] == "-" else Path(sys.argv[1]))
isas = cpu_vec_isa.valid_vec_isa_list()
print(json.dumps({"ran": ran, "isas": [[str(isa), isa.build_arch_flags()] for isa in isas]}))
"""


def _zygote_warm_up(
    answers: Path | None, failing: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", CASE, "-" if answers is None else str(answers), json.dumps(list(failing))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found: dict[str, list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


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


def test_a_session_servers_zygote_keeps_them_in_the_server_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server gives its zygote a private HOME; the outcomes go to the server user's own cache, named in
    the zygote's environment, so every server of this user on this host shares them."""
    from cuda_agent.sandbox.server.config import SandboxServerConfig
    from cuda_agent.sandbox.server.isolation import Isolation
    from cuda_agent.sandbox.server.judge_runner import JudgeService
    from cuda_agent.sandbox.server.judge_zygote import ISA_ANSWERS_ENV
    from cuda_agent.sandbox.server.metrics import Metrics

    monkeypatch.setenv("HOME", str(tmp_path / "server-home"))
    config = SandboxServerConfig(state_dir=tmp_path / "state", isolation="restricted", user_namespaces="off")
    service = JudgeService(config, Isolation(config, "restricted", private_mounts=False), Metrics(), 0)
    zygote_env = service.zygote_env()
    answers = tmp_path / "server-home" / ".cache" / "cuda-agent" / "inductor-cpu-isa"
    assert zygote_env["HOME"] != str(tmp_path / "server-home")
    assert zygote_env[ISA_ANSWERS_ENV] == str(answers)

    first = _zygote_warm_up(None, env={**os.environ, ISA_ANSWERS_ENV: str(answers)})
    if not first["ran"]:
        pytest.skip("inductor checks no vector ISA on this machine")
    [kept] = list(answers.iterdir())
    assert kept.stat().st_mode & 0o077 == 0
    again = _zygote_warm_up(None, env={**os.environ, ISA_ANSWERS_ENV: str(answers)})
    assert again["ran"] == [] and again["isas"] == first["isas"]
