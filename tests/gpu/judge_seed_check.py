"""The judge seed on a GPU host (run on the lent H200; not collected by pytest).

1. Builds a CUDA seed as the sandbox image does, with the GPU hidden (CUDA_VISIBLE_DEVICES=""), so the
   toolchain has no device capability: the header's key must not depend on it.
2. Judges one load_inline candidate twice, each with a fresh, empty build cache: without the seed (the
   precompiled header is built) and with it (the build log must say the seed's header was used).
Writes each verdict and the seed's output under $OUT and prints a short table last.

  PYTHONPATH=sandbox_image:platform python3 tests/gpu/judge_seed_check.py            # on the H200
  PYTHONPATH=sandbox_image:platform python3 tests/gpu/judge_seed_check.py --device cpu \\
      --seed-dir ~/.cache/cuda-agent/judge-seed                                      # the logic, on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/judge-seed-check"))
TASK = REPO / "examples" / "tasks" / "relu_mul_add.py"
SEED_NOTE = "from the judge seed"


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "sandbox_image"), str(REPO / "platform"), env.get("PYTHONPATH", "")]
    )
    return env


def build_seed(seed: Path, device: str) -> tuple[float, str]:
    """`cuda-agent judge-seed` for the example solutions' flag set, the GPU hidden as in an image build."""
    boot = "import sys; from cuda_agent.sandbox.judge.seed import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", boot, "--out", str(seed), "--device", device, "--flags=-O3"]
    start = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(CUDA_VISIBLE_DEVICES=""), timeout=900, check=False
    )
    output = (proc.stdout + proc.stderr).strip()
    (OUT / "seed.txt").write_text(output + "\n")
    if proc.returncode != 0:
        raise SystemExit(f"judge-seed failed ({proc.returncode}): {output[-2000:]}")
    return time.monotonic() - start, output


def judge(name: str, device: str, cache: Path, seed: Path | None) -> dict[str, object]:
    extra = {"CUDA_AGENT_JUDGE_CACHE": str(cache)}
    if seed is not None:
        extra["CUDA_AGENT_JUDGE_SEED"] = str(seed)
    candidate = REPO / "examples" / "solutions" / "relu_mul_add" / device / "model_new.py"
    boot = "import sys; from cuda_agent.sandbox.judge.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", boot, str(TASK), str(candidate), "--device", device, "--json"]
    cmd += ["--compile-mode", "none", "--trials", "2", "--profile-trials", "5", "--no-service"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(**extra), timeout=900, check=False)
    wall = time.monotonic() - start
    (OUT / f"{name}.stderr.txt").write_text(proc.stderr[-20_000:])
    try:
        verdict: dict[str, object] = json.loads(proc.stdout)
    except ValueError:
        verdict = {"reward": None, "error": f"exit {proc.returncode}: {proc.stdout[:300]!r}"}
    verdict["wall_s"] = wall
    (OUT / f"{name}.json").write_text(json.dumps(verdict, indent=1))
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--seed-dir", type=Path, default=None, help="reuse this seed (default: a fresh one)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="judge-seed-check-"))
    seed = args.seed_dir.expanduser() if args.seed_dir else work / "seed"
    rows = []
    try:  # each build cache holds a ~0.7-1 GB header: nothing of it stays behind
        seed_s, seed_out = build_seed(seed, args.device)
        for name, used in (("without_seed", None), ("with_seed", seed)):
            verdict = judge(name, args.device, work / f"cache-{name}", used)
            seconds = verdict.get("seconds") or {}
            build_s = seconds.get("build") if isinstance(seconds, dict) else None
            log = str(verdict.get("build_log") or "")
            rows.append((name, verdict.get("reward"), build_s, verdict.get("wall_s"), SEED_NOTE in log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"seed ({args.device}, GPU hidden): {seed_s:.1f} s\n{seed_out}")
    print(f"{'run':<14} {'reward':>6} {'build s':>8} {'wall s':>7}  seed used")
    for name, reward, build_s, wall, used in rows:
        build_text = f"{build_s:8.1f}" if isinstance(build_s, int | float) else f"{'-':>8}"
        wall_text = f"{wall:7.1f}" if isinstance(wall, int | float) else f"{'-':>7}"
        print(f"{name:<14} {reward!s:>6} {build_text} {wall_text}  {used}")
    ok = rows[1][4] and not rows[0][4] and all(isinstance(r[1], int) and r[1] >= 1 for r in rows)
    print("PASS" if ok else "FAIL: the judge with the seed did not use it, or a verdict was not >= 1")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
