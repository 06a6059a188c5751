#!/usr/bin/env python3
"""Judge benchmark on one H200: how long an evaluation takes, how repeatable its speedups are, how many
evaluations a GPU-hour buys. Prints a table last; every ratio's baseline is measured in the same run.

    OUT=/some/dir python bench/judge_bench.py [--candidate layernorm/cuda_ws] [--budget 560]

Measures (targets from the judge issue):
  cold, empty cache       a fresh --cache-dir: toolchain probe, precompiled torch header, every object
  cold candidate          a never-seen candidate (nonce in every kernel source) with a warm cache: the
                          reinforcement-learning case, where each rollout brings new kernel text   <= 15 s p50
  new kernel              new .cu text, bindings unchanged (an agent iterating on its kernels)    <= 15 s p50
  cached                  the same candidate again (all objects and the link cached)               <= 2 s p50
  load_inline             never-seen KernelBench-format candidates, 4 in flight, warm cache       <= 30 s p50
  speedup CV              10 re-evaluations of one kernel: CV of speedup vs eager and vs compile   <= 1 %
  evaluations / GPU-hour  fresh candidates with several builds in flight, vs one at a time
With --via zygote every evaluation is forked from a judge zygote started once (as the session server runs
the judge: torch and inductor imported once per server) instead of a fresh `cuda-agent judge` process.
Baselines: torch's own cpp_extension.load() of the same sources in a fresh build directory (cold build);
per-call CUDA-event timing with an L2 flush (KernelBench's method) for the eager/compile ratio's CV; one
evaluation in flight for throughput. Uses the device image's packages only (torch, ninja, nvcc); the judge
runs as `cuda_agent.cli judge` with PYTHONPATH = sandbox_image:platform. Raw reports go to $OUT/judge_bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "judge"))

from fixture_catalog import (  # noqa: E402
    SOLUTIONS_DIR,
    TASKS_DIR,
    ZygoteRunner,
    parse_single_json,
    task_at_scale,
)


def cli_entry(command: str) -> str:
    """`python -c` text running one cuda-agent subcommand with this process's arguments."""
    return f"import sys; from cuda_agent.cli import main; sys.exit(main([{command!r}, *sys.argv[1:]]))"


JUDGE_ENTRY = cli_entry("judge")
SERVICE_ENTRY = cli_entry("judge-service")
FROZEN_DIR = REPO / "sandbox_image" / "cuda_agent" / "sandbox" / "judge" / "frozen"

# KernelBench-style timing of eager vs torch.compile on the task, run in a child process: per-call CUDA
# events, 256 MB L2 flush before each call, median of N calls; repeated R times.
NAIVE_TIMING = r"""
import importlib.util, json, statistics, sys, torch
spec = importlib.util.spec_from_file_location("task", sys.argv[1])
task = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task)
repeats, calls = int(sys.argv[2]), int(sys.argv[3])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
model = task.Model(*task.get_init_inputs()).cuda().eval()
inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in task.get_inputs()]
compiled = torch.compile(model)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def median_ms(fn):
    times = []
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)
        for _ in range(calls):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(*inputs); end.record(); torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)
ratios = []
for _ in range(repeats):
    ratios.append(median_ms(model) / median_ms(compiled))
print(json.dumps(ratios))
"""

TORCH_LOAD_BASELINE = r"""
import sys, time, torch.utils.cpp_extension as ce
sources, include_dir, build_dir = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
start = time.monotonic()
ce.load(name="cuda_extension", sources=sources, extra_include_paths=[include_dir], build_directory=build_dir,
        extra_cflags=["-O2"], extra_cuda_cflags=["-O3"], verbose=False)
print(time.monotonic() - start)
"""


# A KernelBench-style load_inline candidate for relu_mul_add: torch types and factories in the CUDA source,
# as most generated kernels write it (the example solution keeps torch out of its .cu instead).
INLINE_TORCH_CU = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
// bench nonce NONCE

__global__ void relu_mul_add_kernel(const float* a, const float* b, const float* c, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float p = a[i] * b[i]; out[i] = (p > 0.f ? p : 0.f) + c[i]; }
}

torch::Tensor relu_mul_add(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    TORCH_CHECK(a.is_cuda() && a.is_contiguous(), "a must be a contiguous CUDA tensor");
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    relu_mul_add_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

_ext = load_inline(
    name="bench_relu_mul_add_kb",
    cpp_sources="torch::Tensor relu_mul_add(torch::Tensor a, torch::Tensor b, torch::Tensor c);",
    cuda_sources=_CUDA,
    functions=["relu_mul_add"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return _ext.relu_mul_add(a, b, c)
'''


@dataclass
class Evaluation:
    wall_s: float
    report: dict[str, Any] | None
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.get("reward") in (1, 2, 3)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.out = args.out / "judge_bench"
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="judge_bench_"))
        paths = [str(args.deps.resolve())] if args.deps else []
        paths += [str(REPO / "sandbox_image"), str(REPO / "platform")]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "CUDA_AGENT_TASK_SCALE": args.scale}
        task, variant = args.candidate.split("/")
        self.solution = SOLUTIONS_DIR / task / variant
        if not (self.solution / "kernels").is_dir():
            raise SystemExit(
                f"judge_bench: --candidate {args.candidate} must be a workspace (kernels/) solution"
            )
        self.task = task_at_scale(TASKS_DIR / f"{task}.py", args.scale, self.work / "tasks")
        self.warm_cache = self.work / "cache-warm"
        self.log_index = 0
        self.rows: list[tuple[str, str, str, str, str, str]] = []
        self.cold_candidate_p50: float | None = None
        self.breakdowns: list[tuple[str, float, dict[str, float]]] = []
        self.zygote = ZygoteRunner(self.env, self.out) if args.via == "zygote" else None
        self.service = self.start_service() if args.via == "service" else None

    def start_service(self) -> subprocess.Popen[str]:
        """`cuda-agent judge-service` on a socket of this run; every CLI judge below is told to use it."""
        socket_path = self.work / "service" / "judge.sock"
        service = subprocess.Popen(
            [
                sys.executable,
                "-c",
                JUDGE_ENTRY.replace("'judge'", "'judge-service'"),
                "--socket",
                str(socket_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        assert service.stdout is not None
        started = time.monotonic()
        for line in service.stdout:
            if line.startswith("export "):
                break
        else:
            raise SystemExit("judge_bench: the judge service did not start")
        print(f"judge service ready in {time.monotonic() - started:.1f} s (once per machine)", flush=True)
        self.env["CUDA_AGENT_JUDGE_SERVICE"] = str(socket_path)
        return service

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def over_budget(self) -> bool:
        return self.elapsed() > float(self.args.budget)

    def fresh_candidate(self, suffixes: tuple[str, ...] = (".cu", ".cpp", ".h", ".cuh")) -> Path:
        """A copy of the solution whose sources with these suffixes carry a nonce: new content, so
        nothing built from them is cached (by default every source: kernels and bindings)."""
        target = self.work / "candidates" / uuid.uuid4().hex[:12]
        shutil.copytree(self.solution, target)
        for source in (target / "kernels").iterdir():
            if source.suffix in suffixes:
                source.write_text(source.read_text() + f"\n// bench nonce {uuid.uuid4().hex}\n")
        return target

    def judge(
        self,
        candidate: Path,
        cache: Path,
        label: str,
        task: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> Evaluation:
        command = [
            sys.executable,
            "-c",
            JUDGE_ENTRY,
            str(task or self.task),
            str(candidate),
            "--device",
            self.args.device,
            "--json",
            "--cache-dir",
            str(cache),
        ]
        started = time.monotonic()
        try:
            if self.zygote is not None:
                proc = self.zygote.run(command[3:], self.work, self.args.item_timeout, env)
            else:
                proc = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    env={**self.env, **(env or {})},
                    cwd=REPO,
                    check=False,
                    timeout=self.args.item_timeout,
                )
        except subprocess.TimeoutExpired:
            print(f"  {label:<18} killed after {self.args.item_timeout:.0f} s", flush=True)
            return Evaluation(time.monotonic() - started, None, "timeout")
        ended = time.monotonic()
        wall = ended - started
        self.log_index += 1
        stem = f"{self.log_index:03d}_{label}"
        (self.out / f"{stem}.json").write_text(proc.stdout)
        (self.out / f"{stem}.stderr.txt").write_text(proc.stderr[-100_000:])
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            return Evaluation(wall, None, f"exit {proc.returncode}: {tail[:300]}")
        try:
            report = parse_single_json(proc.stdout)
        except ValueError as exc:
            return Evaluation(wall, None, str(exc))
        problem = (
            None
            if report.get("reward") in (1, 2, 3)
            else f"reward {report.get('reward')}: {report.get('error')}"
        )
        phases = report.get("seconds") or {}
        print(
            f"  {label:<18} {wall:6.1f} s  reward {report.get('reward')}  "
            f"build {phases.get('build', 0):.1f} s  "
            f"verify {phases.get('verify', 0):.1f} s  profile {phases.get('profile', 0):.1f} s  "
            f"cached {report.get('build_cached')}  speedup {report.get('speedup')}",
            flush=True,
        )
        steps = report.get("steps_s") or {}
        print("      steps: " + "  ".join(f"{k} {v:.2f}" for k, v in steps.items()), flush=True)
        clock = debug_clock(report)
        if clock:  # CUDA_AGENT_JUDGE_DEBUG: the judge noted CLOCK_MONOTONIC at its entry and verdict
            print(
                f"      judge process: {clock[0] - started:.2f} s to its entry, {clock[1] - clock[0]:.2f} s "
                f"to its verdict, {ended - clock[1]:.2f} s from verdict to exit seen",
                flush=True,
            )
        return Evaluation(wall, report, problem)

    def breakdown(self, label: str, evaluations: list[Evaluation]) -> None:
        """Median seconds per judge step over the successful evaluations of one section."""
        reports = [ev.report for ev in evaluations if ev.ok and ev.report]
        if not reports:
            return
        names = list(dict.fromkeys(k for r in reports for k in (r.get("steps_s") or {})))
        walls = [ev.wall_s for ev in evaluations if ev.ok]
        medians = {n: statistics.median((r.get("steps_s") or {}).get(n, 0.0) for r in reports) for n in names}
        self.breakdowns.append((label, statistics.median(walls), medians))

    def row(
        self, metric: str, value: str, baseline: str = "-", ratio: str = "-", target: str = "-", ok: str = "-"
    ) -> None:
        self.rows.append((metric, value, baseline, ratio, target, ok))

    # -- sections ------------------------------------------------------------------------------------
    def cold_empty_cache(self) -> None:
        print("cold evaluations, empty cache:", flush=True)
        walls = []
        for n in range(self.args.cold_runs):
            if self.over_budget():
                break
            cache = self.warm_cache if n == 0 else self.work / f"cache-cold-{n}"
            ev = self.judge(self.fresh_candidate(), cache, "cold-empty-cache")
            if ev.ok:
                walls.append(ev.wall_s)
            else:
                print(f"    failed: {ev.problem}", flush=True)
        baseline = self.torch_load_baseline()
        if walls:
            p50 = statistics.median(walls)
            ratio = f"{p50 / baseline:.2f}x" if baseline else "-"
            self.row(
                "cold, empty cache (p50 s)",
                f"{p50:.1f} (n={len(walls)})",
                f"{baseline:.1f} torch load()" if baseline else "-",
                ratio,
            )

    def torch_load_baseline(self) -> float | None:
        """torch.utils.cpp_extension.load of the same sources (frozen binding included), fresh build dir."""
        if self.over_budget() or self.args.skip_torch_baseline:
            return None
        candidate = self.fresh_candidate()
        build_dir = self.work / "torch-load-build"
        build_dir.mkdir()
        sources = [str(p) for p in sorted((candidate / "kernels").iterdir()) if p.suffix in (".cu", ".cpp")]
        sources.append(str(FROZEN_DIR / "binding.cpp"))
        proc = subprocess.run(
            [sys.executable, "-c", TORCH_LOAD_BASELINE, ",".join(sources), str(FROZEN_DIR), str(build_dir)],
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
            timeout=self.args.item_timeout,
        )
        if proc.returncode != 0:
            print(f"  torch load() baseline failed: {proc.stderr.strip()[-500:]}", flush=True)
            return None
        seconds = float(proc.stdout.strip().splitlines()[-1])
        print(f"  torch load() baseline (build only) {seconds:.1f} s", flush=True)
        return seconds

    def repeated(
        self, make_candidate: Callable[[], Path], label: str, section: str
    ) -> tuple[list[float], list[float]]:
        """--runs evaluations of make_candidate() (within the budget): walls and build seconds of the
        successful ones; the section's per-step breakdown is recorded on the way."""
        walls, builds, evaluations = [], [], []
        for _ in range(self.args.runs):
            if self.over_budget():
                break
            ev = self.judge(make_candidate(), self.warm_cache, label)
            evaluations.append(ev)
            if ev.ok and ev.report:
                walls.append(ev.wall_s)
                builds.append((ev.report.get("seconds") or {}).get("build", 0.0))
        self.breakdown(section, evaluations)
        return walls, builds

    def p50_row(self, metric: str, walls: list[float], builds: list[float], target: float) -> float:
        p50 = statistics.median(walls)
        self.row(
            metric,
            f"{p50:.1f} (build {statistics.median(builds):.1f})",
            "-",
            "-",
            f"<= {target:g}",
            "yes" if p50 <= target else "NO",
        )
        return p50

    def cold_candidates(self) -> None:
        print("cold candidates (new kernel text, warm cache):", flush=True)
        walls, builds = self.repeated(self.fresh_candidate, "cold-candidate", "cold candidate")
        if walls:
            self.cold_candidate_p50 = self.p50_row("cold candidate (p50 s)", walls, builds, 15)

    def new_kernels(self) -> None:
        """New kernel text with the bindings unchanged: an agent iterating on its .cu files."""
        print("new kernels (new .cu text, bindings unchanged, warm cache):", flush=True)
        walls, builds = self.repeated(
            lambda: self.fresh_candidate((".cu", ".cuh")), "new-kernel", "new kernel"
        )
        if walls:
            self.p50_row("new kernel, same bindings (p50 s)", walls, builds, 15)

    def cached(self) -> None:
        print("cached evaluations (same candidate again):", flush=True)
        candidate = self.fresh_candidate()
        self.judge(candidate, self.warm_cache, "cached-warmup")
        walls, builds = self.repeated(lambda: candidate, "cached", "cached")
        if walls:
            p50 = statistics.median(walls)
            base = self.cold_candidate_p50
            self.row(
                "cached (p50 s)",
                f"{p50:.1f} (build {statistics.median(builds):.1f})",
                f"{base:.1f} cold candidate" if base else "-",
                f"{p50 / base:.2f}x" if base else "-",
                "<= 2",
                "yes" if p50 <= 2 else "NO",
            )

    def inline_candidates(self) -> None:
        """Never-seen load_inline candidates (KernelBench format), 4 in flight, warm cache: the example
        solution (no torch in its .cu) and a KernelBench-style one (torch in its .cu); baseline: the same
        candidates with every CUDA unit compiled exactly as written (CUDA_AGENT_JUDGE_EXACT_HEADERS=1)."""
        print("load_inline candidates (new text, 4 in flight, warm cache):", flush=True)
        task = task_at_scale(TASKS_DIR / "relu_mul_add.py", self.args.scale, self.work / "tasks-inline")
        example = (SOLUTIONS_DIR / "relu_mul_add" / "cuda" / "model_new.py").read_text()
        kinds = {
            "example (raw .cu)": lambda: example.replace(
                '_CUDA = r"""', f'_CUDA = r"""\n// {uuid.uuid4().hex}'
            ),
            "KernelBench style (torch in .cu)": lambda: INLINE_TORCH_CU.replace("NONCE", uuid.uuid4().hex),
        }
        for label, make in kinds.items():
            if self.over_budget():
                return
            self.judge(self.inline_candidate(make()), self.warm_cache, "inline-warmup", task=task)
            results: dict[str, list[Evaluation]] = {}
            for mode, exact in (("light", False), ("exact", True)):
                if self.over_budget():
                    break
                env = {"CUDA_AGENT_JUDGE_EXACT_HEADERS": "1"} if exact else {}
                candidates = [self.inline_candidate(make()) for _ in range(self.args.inline_evals)]
                with ThreadPoolExecutor(max_workers=4) as pool:
                    results[mode] = list(
                        pool.map(
                            lambda c, e=env, m=mode: self.judge(
                                c, self.warm_cache, f"inline-{m}", task=task, env=e
                            ),
                            candidates,
                        )
                    )
                self.breakdown(f"inline {label} {mode}", results[mode])
            light = [e for e in results.get("light", []) if e.ok]
            exact_walls = [e.wall_s for e in results.get("exact", []) if e.ok]
            if not light:
                problems = [e.problem for e in results.get("light", [])]
                print(f"  {label}: no successful evaluation: {problems}", flush=True)
                continue
            p50 = statistics.median(e.wall_s for e in light)
            build = statistics.median((e.report or {}).get("seconds", {}).get("build", 0.0) for e in light)
            base = statistics.median(exact_walls) if exact_walls else None
            self.row(
                f"load_inline {label}, 4 in flight (p50 s)",
                f"{p50:.1f} (build {build:.1f}, n={len(light)})",
                f"{base:.1f} exact headers" if base else "-",
                f"{p50 / base:.2f}x" if base else "-",
                "<= 30",
                "yes" if p50 <= 30 else "NO",
            )

    def inline_candidate(self, source: str) -> Path:
        target = self.work / "candidates" / uuid.uuid4().hex[:12]
        target.mkdir(parents=True)
        (target / "model_new.py").write_text(source)
        return target

    def speedup_cv(self) -> None:
        print(f"speedup repeatability ({self.args.cv_runs} re-evaluations of one kernel):", flush=True)
        candidate = self.fresh_candidate()
        eager, compiled = [], []
        for _ in range(self.args.cv_runs):
            if self.over_budget():
                break
            ev = self.judge(candidate, self.warm_cache, "cv")
            speed = (ev.report or {}).get("speedup") or {}
            if ev.ok and speed.get("eager") and speed.get("compile"):
                eager.append(float(speed["eager"]))
                compiled.append(float(speed["compile"]))
        naive = self.naive_ratio_cv()
        for label, values in (("vs eager", eager), ("vs compile", compiled)):
            if len(values) >= 3:
                cv = statistics.pstdev(values) / statistics.mean(values)
                baseline = (
                    f"{naive * 100:.2f} % events/call" if naive is not None and label == "vs compile" else "-"
                )
                ratio = f"{cv / naive:.2f}x" if naive and label == "vs compile" else "-"
                self.row(
                    f"speedup CV {label} (n={len(values)}, mean {statistics.mean(values):.3f})",
                    f"{cv * 100:.2f} %",
                    baseline,
                    ratio,
                    "<= 1 %",
                    "yes" if cv <= 0.01 else "NO",
                )

    def naive_ratio_cv(self) -> float | None:
        """CV of the eager/compile time ratio measured KernelBench's way (same task, same GPU, same run)."""
        if self.over_budget() or self.args.device != "cuda":
            return None
        proc = subprocess.run(
            [sys.executable, "-c", NAIVE_TIMING, str(self.task), str(self.args.cv_runs), "50"],
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
            timeout=self.args.item_timeout,
        )
        if proc.returncode != 0:
            print(f"  naive timing baseline failed: {proc.stderr.strip()[-500:]}", flush=True)
            return None
        ratios = json.loads(proc.stdout.strip().splitlines()[-1])
        cv = statistics.pstdev(ratios) / statistics.mean(ratios)
        print(
            f"  naive events/call eager/compile ratios {[round(r, 3) for r in ratios]} CV {cv * 100:.2f} %",
            flush=True,
        )
        return float(cv)

    def throughput(self) -> None:
        print(
            f"throughput: {self.args.parallel_evals} fresh candidates, {self.args.jobs} in flight:",
            flush=True,
        )
        if self.over_budget():
            return
        candidates = [self.fresh_candidate() for _ in range(self.args.parallel_evals)]
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.args.jobs) as pool:
            results = list(pool.map(lambda c: self.judge(c, self.warm_cache, "parallel"), candidates))
        wall = time.monotonic() - started
        ok = sum(r.ok for r in results)
        parallel_rate = ok / wall * 3600
        serial_rate = None
        if not self.over_budget():
            print(f"baseline: {self.args.serial_evals} fresh candidates, one at a time:", flush=True)
            started = time.monotonic()
            serial = [
                self.judge(self.fresh_candidate(), self.warm_cache, "serial")
                for _ in range(self.args.serial_evals)
            ]
            serial_wall = time.monotonic() - started
            serial_rate = sum(r.ok for r in serial) / serial_wall * 3600
        self.row(
            f"evaluations / GPU-hour ({self.args.jobs} in flight, {ok}/{len(results)} ok)",
            f"{parallel_rate:.0f}",
            f"{serial_rate:.0f} one at a time" if serial_rate else "-",
            f"{parallel_rate / serial_rate:.2f}x" if serial_rate else "-",
        )

    def breakdown_table(self) -> str:
        """Steps (orchestrator clock; worker.* as the worker reported them, overlapping its parents)."""
        if not self.breakdowns:
            return ""
        names = list(dict.fromkeys(n for _, _, steps in self.breakdowns for n in steps))
        header = ["step (median s)", *(f"{label} ({wall:.1f} s wall)" for label, wall, _ in self.breakdowns)]
        rows = [header]
        rows += [[n, *(f"{steps.get(n, 0.0):.2f}" for _, _, steps in self.breakdowns)] for n in names]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)

    def table(self) -> str:
        header = ("metric", "value", "baseline (same run)", "ratio", "target", "met")
        rows = [header, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def debug_clock(report: dict[str, Any]) -> tuple[float, float] | None:
    """(entry, verdict) monotonic times from a debug judge's note, if it has one."""
    for note in report.get("notes") or []:
        found = re.match(r"debug: monotonic clock at entry ([\d.]+), at verdict ([\d.]+)", str(note))
        if found:
            return float(found[1]), float(found[2])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "judge_bench_out")))
    parser.add_argument(
        "--candidate", default="layernorm/cuda_ws", help="TASK/VARIANT of a workspace solution"
    )
    parser.add_argument(
        "--cold-runs", type=int, default=2, help="evaluations with an empty cache (default 2)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="cold-candidate and cached evaluations (default 5)"
    )
    parser.add_argument(
        "--cv-runs", type=int, default=10, help="re-evaluations for the speedup CV (default 10)"
    )
    parser.add_argument("--parallel-evals", type=int, default=12, help="fresh candidates for throughput")
    parser.add_argument(
        "--inline-evals", type=int, default=4, help="load_inline candidates per kind and mode (default 4)"
    )
    parser.add_argument(
        "--jobs", type=int, default=6, help="evaluations in flight for throughput (default 6)"
    )
    parser.add_argument("--serial-evals", type=int, default=3, help="one-at-a-time baseline evaluations")
    parser.add_argument(
        "--budget", type=float, default=560.0, help="stop starting new work after this many s"
    )
    parser.add_argument("--item-timeout", type=float, default=400.0, help="seconds per judge process")
    parser.add_argument(
        "--skip-torch-baseline", action="store_true", help="skip the torch load() cold baseline"
    )
    parser.add_argument(
        "--deps", type=Path, default=None, help="extra directory for PYTHONPATH (e.g. pydantic)"
    )
    parser.add_argument(
        "--sections",
        default="cold,candidate,kernel,cached,inline,cv,throughput",
        help="comma-separated subset of cold,candidate,kernel,cached,inline,cv,throughput (in this order)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the same sections on a machine without a GPU (use a cpu_ws candidate; no cv section)",
    )
    parser.add_argument("--scale", default="full", help="task scale (examples/tasks/README.md)")
    parser.add_argument(
        "--via",
        choices=("exec", "zygote", "service"),
        default="exec",
        help="a fresh judge process per evaluation; judges forked from one zygote (the server's way); or the "
        "CLI handing each evaluation to `cuda-agent judge-service` (CUDA_AGENT_JUDGE_SERVICE)",
    )
    args = parser.parse_args(argv)
    if args.via == "zygote":
        sys.path[:0] = [str(REPO / "sandbox_image"), str(REPO / "platform")]
        if args.deps:
            sys.path.insert(0, str(args.deps.resolve()))

    bench = Bench(args)
    print(
        f"judge_bench: candidate {args.candidate}, task {bench.task.name} at {args.scale} scale, "
        f"device {args.device}, budget {args.budget:.0f} s, judges via {args.via}",
        flush=True,
    )
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    steps = [
        ("cold", bench.cold_empty_cache),
        ("candidate", bench.cold_candidates),
        ("kernel", bench.new_kernels),
        ("cached", bench.cached),
        ("inline", bench.inline_candidates),
        ("cv", bench.speedup_cv),
        ("throughput", bench.throughput),
    ]
    unknown = sections - {name for name, _ in steps}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}")
    try:
        for name, section in steps:
            if name in sections:
                section()
    finally:
        if bench.zygote is not None:
            bench.zygote.close()
        if bench.service is not None:
            bench.service.terminate()
            bench.service.wait(timeout=60)
        shutil.rmtree(bench.work, ignore_errors=True)
    if bench.over_budget():
        print(f"note: the {args.budget:.0f} s budget ran out; later sections ran fewer times or not at all")
    print()
    if bench.breakdowns:
        print(bench.breakdown_table())
        print()
    print(bench.table())
    print(f"judge_bench: {bench.elapsed():.0f} s")
    return 0 if bench.rows else 1


if __name__ == "__main__":
    sys.exit(main())
