#!/usr/bin/env python3
"""One-shot H200 check of the judge: every CUDA solution and every CUDA attack, judged with --device cuda.

Run from the repository root on the GPU machine (device image: torch, ninja, nvcc; no pydantic needed here):

    OUT=/some/dir python tests/gpu/judge_gpu.py [--jobs 8] [--deadline 500] [--only NAME ...]

Each candidate is judged by a fresh `cuda_agent.cli judge ... --json` process (PYTHONPATH = sandbox_image
and platform), at full task scale. Solutions must earn reward >= 1 with correct=true; each attack must get
reward -1 with one of the outcomes its expect.json names. Builds of different candidates run concurrently
(--jobs); the shared attack kit is built by one candidate before the other kit attacks start, so it is
compiled once. Full JSON reports and stderr go to $OUT/judge_gpu/; a table is printed last.

Exit status: 0 when every expectation held, 1 when any did not (or did not run before the deadline),
2 when the judge cannot start at all (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "judge"))

from fixture_catalog import (  # noqa: E402
    ZygoteRunner,
    judge_attack_verdict,
    judge_solution_verdict,
    load_attacks,
    load_solutions,
    materialise,
    outcome_codes,
    parse_single_json,
    task_at_scale,
)

JUDGE_ENTRY = "import sys; from cuda_agent.cli import main; sys.exit(main(['judge', *sys.argv[1:]]))"
STDERR_KEEP = 200_000


@dataclass
class Item:
    """One judge run to make and what it must show."""

    kind: str  # "solution" | "attack"
    name: str
    task: str
    task_path: Path
    candidate: Path
    expected: tuple[str, ...]
    wave: int  # 1: start at once; 2: start when the kit builder has finished
    check: Any  # report -> None | reason
    kit_builder: bool = False
    report: dict[str, Any] | None = None
    problem: str | None = None  # why the expectation failed (None: it held)
    seconds: float = 0.0
    ran: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def passed(self) -> bool:
        return self.ran and self.problem is None


def _judge_env(extra_paths: list[str]) -> dict[str, str]:
    paths = [*extra_paths, str(REPO / "sandbox_image"), str(REPO / "platform")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["CUDA_AGENT_TASK_SCALE"] = "full"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _preflight(env: dict[str, str]) -> str | None:
    """Print the machine's facts; return why the judge cannot run, or None."""
    probe = (
        "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, "
        "'cuda', torch.version.cuda); "
        "print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() "
        "else 'NONE'); import torch.utils.cpp_extension as c; print('CUDA_HOME', c.CUDA_HOME)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False)
    print(proc.stdout.strip() or proc.stderr.strip()[-2000:], flush=True)
    if proc.returncode != 0 or "gpu NONE" in proc.stdout:
        return "torch cannot see a CUDA device"
    nvcc = shutil.which("nvcc")
    print("nvcc", nvcc or "not on PATH (the judge looks in CUDA_HOME/bin)", flush=True)
    proc = subprocess.run(
        [sys.executable, "-c", "import cuda_agent.sandbox.judge.cli, cuda_agent.sandbox.judge.orchestrator"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        hint = ""
        if "pydantic" in proc.stderr:
            hint = (
                "\nhint: the judge's orchestrator needs pydantic; put a pydantic install for this Python "
                "in a directory (pip install --target DIR pydantic==2.14.3 on a matching machine) and "
                "pass --deps DIR"
            )
        return f"the judge does not import:\n{proc.stderr.strip()[-3000:]}{hint}"
    return None


def _items(workdir: Path) -> list[Item]:
    """Every CUDA solution and CUDA attack, with waves: kit attacks wait until one of them built the kit."""
    tasks_dir = workdir / "tasks"
    full_tasks: dict[str, Path] = {}

    def task_copy(task: str, source: Path) -> Path:
        if task not in full_tasks:
            full_tasks[task] = task_at_scale(source, "full", tasks_dir)
        return full_tasks[task]

    items: list[Item] = []
    for s in load_solutions("cuda"):
        items.append(
            Item(
                "solution",
                s.name,
                s.task,
                task_copy(s.task, s.task_path),
                s.candidate,
                ("pass",),
                1,
                judge_solution_verdict,
            )
        )
    kit_builder_chosen = False
    candidates_dir = workdir / "candidates"
    for a in load_attacks("cuda"):
        # The first runtime kit attack builds the shared kit; the other kit attacks start once it is done
        # and find every object in the judge's cache instead of compiling the same sources eight times.
        builder = a.kit and not a.static_only and not kit_builder_chosen
        wave = 2 if a.kit and not a.static_only and not builder else 1
        kit_builder_chosen = kit_builder_chosen or builder
        candidate = materialise(a, "cuda", candidates_dir)
        items.append(
            Item(
                "attack",
                a.name,
                a.task,
                task_copy(a.task, a.task_path),
                candidate,
                a.expected,
                wave,
                lambda report, a=a: judge_attack_verdict(a, report),
                kit_builder=builder,
            )
        )
    # The kit builder first, then the longest: load_inline CUDA solutions compile torch headers with nvcc.
    items.sort(key=lambda i: (i.wave, not i.kit_builder, i.kind != "solution", i.candidate.is_dir(), i.name))
    return items


class Runner:
    def __init__(
        self,
        env: dict[str, str],
        logs: Path,
        deadline: float,
        item_timeout: float,
        zygote: ZygoteRunner | None = None,
        work: Path | None = None,
    ) -> None:
        self.env = env
        self.zygote = zygote
        self.work = work or logs
        self.logs = logs
        self.deadline = deadline
        self.item_timeout = item_timeout
        self.lock = threading.Lock()
        self.done = 0
        self.total = 0
        self.start = time.monotonic()

    def exec_judge(self, command: list[str], item: Item, timeout: float) -> tuple[int, str, str]:
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=REPO,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            item.problem = f"judge process killed after {time.monotonic() - started:.0f} s (script deadline)"
        return proc.returncode, stdout, stderr

    def run(self, item: Item) -> Item:
        left = self.deadline - time.monotonic()
        if left < 30:
            item.problem = "not run: deadline reached"
            return item
        command = [
            sys.executable,
            "-c",
            JUDGE_ENTRY,
            str(item.task_path),
            str(item.candidate),
            "--device",
            "cuda",
            "--json",
        ]
        item.ran = True
        started = time.monotonic()
        if self.zygote is not None:
            try:
                proc = self.zygote.run(command[3:], self.work, min(self.item_timeout, left))
                returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired:
                returncode, stdout, stderr = -9, "", ""
                item.problem = f"judge killed after {time.monotonic() - started:.0f} s (script deadline)"
        else:
            returncode, stdout, stderr = self.exec_judge(command, item, min(self.item_timeout, left))
        item.seconds = time.monotonic() - started
        stem = item.label.replace(":", "__").replace("/", "__")
        (self.logs / f"{stem}.json").write_text(stdout)
        (self.logs / f"{stem}.stderr.txt").write_text(stderr[-STDERR_KEEP:])
        (self.logs / f"{stem}.cmd.txt").write_text(" ".join(command) + "\n")
        if item.problem is None:
            if returncode != 0:
                tail = stderr.strip().splitlines()[-1:] or ["(no stderr)"]
                item.problem = f"judge exited {returncode}: {tail[0][:300]}"
            else:
                try:
                    item.report = parse_single_json(stdout)
                    item.problem = item.check(item.report)
                except ValueError as exc:
                    item.problem = f"bad stdout: {exc}"
        with self.lock:
            self.done += 1
            status = "PASS" if item.passed else "FAIL"
            elapsed = time.monotonic() - self.start
            detail = _short_outcome(item)
            print(
                f"[{self.done:3d}/{self.total} {elapsed:5.0f}s] {status} {item.label} "
                f"({item.seconds:.0f}s) {detail}",
                flush=True,
            )
        return item


def _short_outcome(item: Item) -> str:
    if item.report is None:
        return item.problem or ""
    r = item.report
    codes = sorted(outcome_codes(r))
    text = f"reward {r.get('reward')}"
    if codes:
        text += " [" + ", ".join(codes) + "]"
    if item.problem:
        text += f" -- {item.problem[:200]}"
    return text


def _fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(items: list[Item]) -> str:
    header = (
        "kind",
        "candidate",
        "expected",
        "reward",
        "outcome (violations / error)",
        "vs eager",
        "vs compile",
        "secs",
        "result",
    )
    rows = [header]
    for item in items:
        r = item.report or {}
        speed = r.get("speedup") or {}
        outcome = ", ".join(sorted(outcome_codes(r))) if r else (item.problem or "")
        if r.get("error") and "wrong-result" not in outcome:
            outcome = (outcome + " " if outcome else "") + str(r["error"])[:60]
        result = "pass" if item.passed else ("not run" if not item.ran else "FAIL")
        rows.append(
            (
                item.kind,
                item.name,
                ",".join(item.expected)[:34],
                str(r.get("reward", "-")),
                outcome[:60],
                _fmt(speed.get("eager")),
                _fmt(speed.get("compile")),
                f"{item.seconds:.0f}",
                result,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "judge_gpu_out")))
    parser.add_argument("--jobs", type=int, default=8, help="judge processes in flight (default 8)")
    parser.add_argument(
        "--deadline", type=float, default=500.0, help="seconds for the whole run (default 500)"
    )
    parser.add_argument("--item-timeout", type=float, default=420.0, help="seconds per judge process")
    parser.add_argument("--only", nargs="*", default=None, help="run only candidates whose name contains one")
    parser.add_argument(
        "--deps", type=Path, default=None, help="extra directory for PYTHONPATH (e.g. pydantic)"
    )
    parser.add_argument(
        "--via",
        choices=("exec", "zygote"),
        default="exec",
        help="a judge process per candidate, or judges forked from one zygote (the session server's way)",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()

    logs = args.out / "judge_gpu"
    logs.mkdir(parents=True, exist_ok=True)
    env = _judge_env([str(args.deps.resolve())] if args.deps else [])
    reason = _preflight(env)
    if reason:
        print(f"judge_gpu: cannot run: {reason}", flush=True)
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="judge_gpu_"))
    items = _items(workdir)
    if args.only:
        items = [i for i in items if any(part in i.label for part in args.only)]
    print(
        f"judge_gpu: {len(items)} candidates ({sum(i.kind == 'solution' for i in items)} solutions), "
        f"{args.jobs} in flight, deadline {args.deadline:.0f} s; logs in {logs}",
        flush=True,
    )

    zygote = None
    if args.via == "zygote":
        sys.path[:0] = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
        zygote = ZygoteRunner(env, logs)
    runner = Runner(env, logs, start + args.deadline, args.item_timeout, zygote, workdir)
    runner.total = len(items)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(runner.run, i): i for i in items if i.wave == 1}
        builders = [f for f, i in futures.items() if i.kit_builder]
        for future in builders:
            future.result()
        futures.update({pool.submit(runner.run, i): i for i in items if i.wave == 2})
        for future in as_completed(futures):
            future.result()

    summary = [
        {
            "kind": i.kind,
            "name": i.name,
            "task": i.task,
            "expected": list(i.expected),
            "ran": i.ran,
            "passed": i.passed,
            "problem": i.problem,
            "seconds": round(i.seconds, 1),
            "report": i.report,
        }
        for i in items
    ]
    (logs / "summary.json").write_text(json.dumps(summary, indent=1))
    if zygote is not None:
        zygote.close()
    shutil.rmtree(workdir, ignore_errors=True)

    passed = sum(i.passed for i in items)
    not_run = sum(not i.ran for i in items)
    failed = len(items) - passed - not_run
    print()
    print(_table(items))
    print()
    for item in items:
        if not item.passed:
            print(f"FAIL {item.label}: {item.problem}")
    rewards = [i.report.get("reward") for i in items if i.kind == "solution" and i.report]
    print(
        f"solutions: rewards {sorted(rewards, key=lambda r: (r is None, r))}; "
        f"wall {time.monotonic() - start:.0f} s"
    )
    print(f"judge_gpu: {passed} passed, {failed} failed, {not_run} not run")
    return 0 if passed == len(items) else 1


if __name__ == "__main__":
    sys.exit(main())
