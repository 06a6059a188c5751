"""The judge seed is trusted input: the server refuses one that judges or agents could write, and a judge
confined as restricted mode confines it can read the seed but not write into it (Landlock)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_helpers import needs_root, state_root

from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import Isolation, landlock_abi
from cuda_agent.sandbox.server.judge_seed import SeedRefused, seed_exposure, usable_judge_seed

UID_BASE = 61000


def make_seed(root: Path) -> Path:
    """A seed as `cuda-agent judge-seed` lays it out: directories 0755, files 0644, the caller's own."""
    entry = root / "seed" / "pch" / "0123abcd"
    entry.mkdir(parents=True)
    for path in (root / "seed", root / "seed" / "pch", entry):
        path.chmod(0o755)
    for name in ("torch_extension_pch.h", "torch_extension_pch.h.gch"):
        (entry / name).write_text("#pragma once\n")
        (entry / name).chmod(0o644)
    return root / "seed"


def config(state: Path, seed: Path | None = None) -> SandboxServerConfig:
    return SandboxServerConfig(state_dir=state, uid_base=UID_BASE, judge_seed_dir=seed)


@needs_root()
def test_root_mode_refuses_a_seed_judges_or_agents_could_write(tmp_path: Path) -> None:
    seed = make_seed(tmp_path)
    settings = config(tmp_path / "state")
    assert seed_exposure(seed, settings, "root", landlock=False) == []
    gch = next(seed.rglob("*.gch"))

    gch.chmod(0o664)
    assert "writable by its group or others" in " ".join(seed_exposure(seed, settings, "root", False))
    gch.chmod(0o644)
    os.chown(gch, UID_BASE + 1, UID_BASE + 1)  # the first slot's judge
    assert f"owned by sandbox uid {UID_BASE + 1}" in " ".join(seed_exposure(seed, settings, "root", False))
    os.chown(gch, 0, 0)
    (seed / "pch" / "planted").symlink_to(tmp_path / "state")
    assert "symbolic link" in " ".join(seed_exposure(seed, settings, "root", False))
    (seed / "pch" / "planted").unlink()
    seed.parent.chmod(0o777)  # a directory above it: a judge could swap the whole seed
    assert str(seed.parent) in " ".join(seed_exposure(seed, settings, "root", False))
    seed.parent.chmod(0o1777)  # sticky (as /tmp): only what sandbox uids own there is theirs to move
    assert seed_exposure(seed, settings, "root", False) == []
    assert "overlaps the state directory" in " ".join(
        seed_exposure(seed, config(seed / "pch"), "root", False)
    )


def test_restricted_mode_leans_on_landlock_for_the_servers_own_uid(tmp_path: Path) -> None:
    """One uid for everything: the server's own seed is safe only while the judges' Landlock write list
    excludes it; without Landlock, a seed that uid can write is refused."""
    seed = make_seed(tmp_path)
    settings = config(tmp_path / "state")
    assert seed_exposure(seed, settings, "restricted", landlock=True) == []
    found = seed_exposure(seed, settings, "restricted", landlock=False)
    assert found and all("writable by the server's uid" in f for f in found)


def test_a_missing_seed_is_skipped_and_a_misplaced_one_refused(tmp_path: Path) -> None:
    assert usable_judge_seed(config(tmp_path / "state", tmp_path / "none"), "root", True) is None
    (tmp_path / "file").write_text("")
    with pytest.raises(SeedRefused, match=r"--judge-seed .*: not a directory"):
        usable_judge_seed(config(tmp_path / "state", tmp_path / "file"), "root", True)
    with pytest.raises(SeedRefused, match="below /tmp, which judges get a private"):
        usable_judge_seed(config(Path("/srv/state"), make_seed(tmp_path)), "restricted", True)


@needs_root()
def test_the_server_refuses_to_start_with_a_writable_seed() -> None:
    root = state_root("seed-trust-", mode=0o755)
    try:
        seed = make_seed(root)
        (seed / "pch").chmod(0o775)
        argv = [sys.executable, "-m", "cuda_agent.cli", "sandbox", "serve", "--port", "0"]
        argv += [
            "--state-dir",
            str(root / "state"),
            "--uid-base",
            str(UID_BASE + 1600),
            "--judge-seed",
            str(seed),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--judge-seed {seed}: judges or agents could write it" in done.stderr
        assert f"{seed / 'pch'} is writable by its group or others" in done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


WRITE_PROBE = """
import sys
seed, cache = sys.argv[1], sys.argv[2]
print("read", open(seed + "/pch/0123abcd/torch_extension_pch.h").read().strip())
for target in (seed + "/pch/0123abcd/torch_extension_pch.h.gch", seed + "/planted", cache + "/entry"):
    try:
        with open(target, "a") as handle:
            handle.write("planted")
        print("wrote", target.rsplit("/", 1)[1])
    except OSError as error:
        print("refused", error.errno)
"""


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_restricted_judge_reads_the_seed_but_cannot_write_it(tmp_path: Path) -> None:
    """The judge spec as JudgeService builds it in restricted mode: the seed on the read list, the
    session's scratch and build cache on the write list. Run as root here, which Landlock confines too."""
    state = tmp_path / "state"
    scratch, cache = state / "jobs" / "j" / "scratch", state / "sessions" / "s" / "judge-cache"
    for path in (scratch, cache):
        path.mkdir(parents=True)
    seed = make_seed(tmp_path)
    settings = SandboxServerConfig(
        state_dir=state, isolation="restricted", user_namespaces="off", judge_seed_dir=seed
    )
    isolation = Isolation(settings, "restricted", private_mounts=False)
    argv = [sys.executable, "-I", "-c", WRITE_PROBE, str(seed), str(cache)]
    env = {"PATH": os.environ["PATH"]}
    writable, readable = [str(scratch), str(cache)], [str(scratch.parent), str(seed)]
    spec = isolation.judge_spec(isolation.slot(0), argv, env, str(scratch), writable, readable)
    launched = subprocess.run(isolation.launch_argv(spec), capture_output=True, text=True, timeout=60)
    lines = (launched.stdout + launched.stderr).strip().splitlines()
    assert lines == ["read #pragma once", f"refused {errno.EACCES}", f"refused {errno.EACCES}", "wrote entry"]
    assert (next(seed.rglob("*.gch"))).read_text() == "#pragma once\n"
