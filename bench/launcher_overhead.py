"""What hiding other processes costs an agent command: the launcher's start-to-exit time for `/bin/true`
under restricted mode's agent spec without user namespaces, with the Landlock read rules it gets now (the
tree but the state directory and /proc, plus /proc's system-wide entries and /proc/self) against the rules
it had before (the tree but the state directory), in the same run, interleaved.

    python3 bench/launcher_overhead.py [--runs 200]

Runs as any user; the server's Isolation builds both specs (restricted mode, user namespaces off), so the
launcher, its seccomp filter, rlimits and Landlock are the ones agent commands get. Prints p50 / p90 per
variant and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import Isolation


def one_run(isolation: Isolation, spec: dict[str, Any]) -> float:
    start = time.perf_counter()
    subprocess.run(isolation.launch_argv(spec), check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    # The state directory's siblings each become a rule: /var/lib as in the image (/tmp holds many here).
    parser.add_argument("--state-parent", default="/var/lib" if os.access("/var/lib", os.W_OK) else None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="launcher-bench-", dir=args.state_parent) as root:
        state = Path(root) / "state"
        session = state / "sessions" / "0"
        for d in ("tmp", "shm"):
            (session / d).mkdir(parents=True)
        config = SandboxServerConfig(state_dir=state, isolation="restricted", user_namespaces="off")
        isolation = Isolation(config, "restricted", private_mounts=False)
        argv, env = ["/bin/true"], isolation.base_env() | {"PATH": "/usr/bin:/bin"}
        hidden = isolation.agent_spec(isolation.slot(0), argv, env, str(session), [str(session)])
        landlock = dict(hidden["landlock"], read=list(isolation.landlock_read))
        variants = {
            "/proc/<pid> hidden (now)": hidden,
            "/proc readable (before)": hidden | {"landlock": landlock},
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for spec in variants.values():  # warm-up: page cache, interpreter
            one_run(isolation, spec)
        for _ in range(args.runs):
            for name, spec in variants.items():
                times[name].append(one_run(isolation, spec))
    rules = {name: len(spec["landlock"]["read"]) for name, spec in variants.items()}
    print(
        "\n| agent spec (restricted, no user namespaces) | read rules | p50 ms | p90 ms |\n|---|---|---|---|"
    )
    medians = {}
    for name, values in times.items():
        medians[name] = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"| {name} | {rules[name]} | {medians[name] * 1e3:.2f} | {p90 * 1e3:.2f} |")
    now, before = medians.values()
    print(f"\nratio of medians (now / before): {now / before:.3f} over {args.runs} interleaved runs each")


if __name__ == "__main__":
    main()
