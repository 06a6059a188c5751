"""The one local sandbox launcher (cuda_agent.sandbox.local), used by the operator's local executor, the
trainer's demonstrations and `cuda-agent eval` without --sandbox: the config it writes is one the server
accepts, local servers never share a uid, and a launched server answers and is gone after the block."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest

from cuda_agent.api import SandboxPool, load_resource_file
from cuda_agent.api.episode import on_this_machine
from cuda_agent.api.pool_server import server_config
from cuda_agent.api.sandbox import ServerStatus
from cuda_agent.sandbox import local
from cuda_agent.sandbox.server.config import SandboxServerConfig

REPO = Path(__file__).resolve().parents[2]
POOL_FILES = [REPO / "examples" / "sandboxpool.yaml", REPO / "examples" / "trainingrun-local.yaml"]


def _pools() -> list[SandboxPool]:
    return [r for path in POOL_FILES for r in load_resource_file(path) if isinstance(r, SandboxPool)]


def test_the_launcher_writes_the_servers_own_defaults() -> None:
    fields = SandboxServerConfig.model_fields
    assert fields["max_sessions"].default == local.SERVER_MAX_SESSIONS
    assert fields["max_concurrent_judges"].default == local.SERVER_MAX_CONCURRENT_JUDGES


@pytest.mark.parametrize("pool", [None, *_pools()], ids=lambda p: p.metadata.name if p else "defaults")
def test_a_placed_config_is_valid_loopback_and_uses_the_installed_judge(
    pool: SandboxPool | None, tmp_path: Path
) -> None:
    settings = server_config(on_this_machine(pool.spec)) if pool is not None else {}
    config = SandboxServerConfig.model_validate(local.local_settings(settings, 0, tmp_path / "state"))
    assert (config.host, config.port, config.metrics_port) == ("127.0.0.1", 0, None)
    assert config.state_dir == tmp_path / "state"
    defaults = SandboxServerConfig()
    assert (config.judge_dir, config.judge_seed_dir) == (defaults.judge_dir, defaults.judge_seed_dir)
    if pool is not None:
        assert config.max_sessions == settings["max_sessions"]


@pytest.mark.parametrize("max_sessions", [1, 8, 64, 2048])
def test_neighbouring_uid_ranges_never_overlap(max_sessions: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every uid a root-mode server uses (SandboxServerConfig.sandbox_uids: the judges' group and a pair per
    session and judge slot) lies inside its own range: the next range starts after the last."""
    draws = iter([0, 1, local.UID_RANGES - 1])
    monkeypatch.setattr(local.secrets, "randbelow", lambda n: next(draws))
    configs = [
        SandboxServerConfig.model_validate(
            local.local_settings({"max_sessions": max_sessions}, 0, Path("/tmp/unused"))
        )
        for _ in range(3)
    ]
    first, second, last = (c.sandbox_uids for c in configs)
    assert first.stop <= second.start and min(first) >= local.UID_BASE - 1
    assert len(first) == 2 * (max_sessions + local.SERVER_MAX_CONCURRENT_JUDGES) + 1
    assert max(last) < 2**31  # a uid the kernel accepts


def test_a_launched_server_answers_and_is_removed_afterwards() -> None:
    parent = local.traversable_temp_dir("cuda-agent-test-")  # the sessions' uids traverse it (pytest's: 0700)
    try:
        with local.local_server({"max_sessions": 2}, parent) as url:
            with urllib.request.urlopen(f"{url}/v1/status", timeout=10) as answer:
                status = ServerStatus.model_validate_json(answer.read())
            (root,) = list(parent.iterdir())
            assert url.startswith("http://127.0.0.1:") and status.max_sessions == 2 and status.judge_intact
        assert not root.exists()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
