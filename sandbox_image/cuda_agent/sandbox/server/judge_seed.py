"""The judge seed's trust check at startup (`--judge-seed DIR`, SandboxServerConfig.judge_seed_dir).

The seed holds precompiled torch headers that every judge compiles candidates against, used in place
(docs/judge.md, "Build and cache"): whoever can change it can put code into every later build. So it is
trusted input, written only by the image or the server's operator, and the server refuses at startup a
seed that a judge or an agent could write, rather than silently using it. Root mode: judges and agents
run as the sandbox uid range (`uid_base - 1` is the judges' group), so no entry of the seed, and no
directory above it, may be owned by one of those uids or be group/other-writable (a sticky directory above
it, like /tmp, only protects what its sandbox uids do not own). Restricted mode (one uid for everything):
the judges' Landlock write list (scratch, build cache, GPU lock, /dev) must exclude it, so the seed may not
overlap the state directory, and without Landlock nothing of it may be writable by the server's own uid.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import PRIVATE_SCRATCH

log = logging.getLogger(__name__)


class SeedRefused(Exception):
    """The configured seed could be written by judges or agents (the message says which path and why)."""


def seed_exposure(seed: Path, config: SandboxServerConfig, mode: str, landlock: bool) -> list[str]:
    """Why judges or agents could change the seed at `seed` (an existing directory); empty: they cannot."""
    found: list[str] = []
    real = seed.resolve()
    state = config.state_dir.resolve()
    if real == state or real.is_relative_to(state) or state.is_relative_to(real):
        found.append(f"{real} overlaps the state directory {state}, where judges and agents write")
    uids = config.sandbox_uids if mode == "root" else range(0)
    entries = [(p, True) for p in reversed(real.parents)] + [(real, False)]
    for dirpath, dirnames, filenames in os.walk(real):
        entries += [(Path(dirpath, name), False) for name in [*dirnames, *filenames]]
    for path, above in entries:
        st = os.lstat(path)
        sticky = above and st.st_mode & stat.S_ISVTX
        if stat.S_ISLNK(st.st_mode):
            found.append(f"{path} is a symbolic link (its target is not checked)")
        elif st.st_mode & 0o022 and not sticky:
            found.append(f"{path} is writable by its group or others (mode {stat.filemode(st.st_mode)})")
        elif st.st_uid in uids:
            found.append(f"{path} is owned by sandbox uid {st.st_uid}")
        elif mode != "root" and not landlock and os.access(path, os.W_OK):
            found.append(f"{path} is writable by the server's uid, which judges share (no Landlock)")
    return found


def usable_judge_seed(config: SandboxServerConfig, mode: str, landlock: bool) -> Path | None:
    """The seed directory judges may use, None when none is configured or it does not exist (a warning:
    a seed only saves build time). Raises SeedRefused when judges or agents could write it."""
    seed = config.judge_seed_dir
    if seed is None:
        return None
    if not seed.exists():
        log.warning("--judge-seed %s does not exist: judges build their precompiled headers", seed)
        return None
    if not seed.is_dir():
        raise SeedRefused(f"--judge-seed {seed}: not a directory")
    below = [p for p in PRIVATE_SCRATCH if seed.resolve().is_relative_to(p)]
    if below:  # judges with namespaces get an empty one of each: they would never see the seed
        raise SeedRefused(f"--judge-seed {seed}: below {below[0]}, which judges get a private, empty one of")
    found = seed_exposure(seed, config, mode, landlock)
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise SeedRefused(
            f"--judge-seed {seed}: judges or agents could write it, and judges compile every candidate "
            f"against it: {'; '.join(found[:3])}{more}. Build it with `cuda-agent judge-seed --out DIR` as "
            "another user, or in the image, where they cannot (docs/judge.md)"
        )
    return seed.resolve()
