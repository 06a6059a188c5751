"""Task sets and candidates on disk.

Tasks: KernelBench's layout (`level1/1_Square_matrix_multiplication_.py`: levels as folders) or a flat
folder of `name.py` files (examples/tasks: one level named after the folder), from a local path or an
s3:// prefix. Candidates for a task, looked up in the solutions directory in this order:

    <level>/<task>/ or <task>/          a model_new.py, a CUDA Agent workspace (kernels/, model_new.py), or
                                        variant folders (examples/solutions: cpu, cpu_ws, cuda, cuda_ws;
                                        those named for another device are skipped)
    <level>/<task>.py or <task>.py      a single model_new.py under the task's name
    level_<L>_problem_<P>_sample_<S>_kernel.py anywhere below (KernelBench's generate_samples output;
                                        L from the level folder's digits, P the task's leading number)
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.api.judge import Device

_KERNELBENCH_RUN = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_DEVICE_VARIANT = re.compile(r"^(cpu|cuda)(_.*)?$")


@dataclass(frozen=True)
class Task:
    level: str
    name: str
    source: str
    path: Path | None = None  # a local file the judge can read; None for tasks fetched from s3://

    @property
    def key(self) -> str:
        return f"{self.level}/{self.name}"


@dataclass(frozen=True)
class Candidate:
    task: Task
    path: Path  # a model_new.py-like file or a workspace directory
    label: str | None = None  # variant folder or KernelBench sample, when a task has several

    @property
    def key(self) -> str:
        return self.task.key + (f"/{self.label}" if self.label else "")

    @property
    def is_workspace(self) -> bool:
        return self.path.is_dir() and (self.path / "kernels").is_dir()

    @property
    def model_new(self) -> Path:
        return self.path / "model_new.py" if self.path.is_dir() else self.path

    def files(self) -> dict[str, str]:
        """Relative path -> text of a workspace's files (what /v1/evaluate's `files` takes)."""
        return {
            str(p.relative_to(self.path)): p.read_text()
            for p in sorted(self.path.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }


def _task_files(root: Path) -> list[tuple[str, Path]]:
    """(level, file) for every task under a local root: its own *.py, then one folder level down."""
    if root.is_file():
        return [(root.parent.name or "tasks", root)]
    if not root.is_dir():
        raise FileNotFoundError(f"--tasks {root}: no such file or directory")
    found = [(root.name, p) for p in sorted(root.glob("*.py")) if p.name != "__init__.py"]
    for folder in sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))):
        found += [(folder.name, p) for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"]
    return found


def _s3_tasks(uri: str) -> list[Task]:
    from cuda_agent.storage import open_store

    store = open_store(uri)
    prefix = uri.rstrip("/") + "/"
    root_name = prefix.rstrip("/").rsplit("/", 1)[-1]
    tasks = []
    for info in store.list_objects(prefix):
        relative = info.uri.removeprefix(prefix)
        parts = relative.split("/")
        if not relative.endswith(".py") or len(parts) > 2 or parts[-1] == "__init__.py":
            continue
        level = parts[0] if len(parts) == 2 else root_name
        source = store.get_bytes(info.uri).decode()
        tasks.append(Task(level=level, name=parts[-1].removesuffix(".py"), source=source))
    return sorted(tasks, key=lambda t: t.key)


def load_tasks(location: str, levels: list[str] | None = None, only: list[str] | None = None) -> list[Task]:
    """The task set at `location` (a path or s3:// prefix), filtered by level and task name."""
    if location.startswith("s3://"):
        tasks = _s3_tasks(location)
    else:
        tasks = [
            Task(level=level, name=path.stem, source=path.read_text(), path=path.resolve())
            for level, path in _task_files(Path(location))
        ]
    if levels:
        tasks = [t for t in tasks if t.level in levels]
    if only:
        tasks = [t for t in tasks if t.name in only or t.key in only]
    if not tasks:
        raise FileNotFoundError(f"--tasks {location}: no *.py task found (after --level / --only filters)")
    return tasks


def _is_candidate_dir(path: Path) -> bool:
    return (path / "model_new.py").is_file() or (path / "kernels").is_dir()


def _dir_candidates(task: Task, folder: Path, device: Device) -> list[Candidate]:
    if _is_candidate_dir(folder):
        return [Candidate(task, folder)]
    variants = sorted(d for d in folder.iterdir() if d.is_dir() and _is_candidate_dir(d))
    tagged = [d for d in variants if _DEVICE_VARIANT.match(d.name)]
    if tagged:  # examples/solutions style: keep the variants written for this device
        variants = [d for d in tagged if _DEVICE_VARIANT.match(d.name).group(1) == device]  # type: ignore[union-attr]
    if len(variants) == 1:
        return [Candidate(task, variants[0])]
    return [Candidate(task, d, d.name) for d in variants]


def _level_number(level: str) -> str | None:
    digits = re.findall(r"\d+", level)
    return str(int(digits[-1])) if digits else None


def _kernelbench_runs(solutions: Path) -> dict[tuple[str, str], list[tuple[int, Path]]]:
    """(level number, problem number) -> [(sample, file)] of KernelBench-run generated kernels."""
    runs: dict[tuple[str, str], list[tuple[int, Path]]] = defaultdict(list)
    for path in solutions.rglob("level_*_problem_*_sample_*_kernel.py"):
        match = _KERNELBENCH_RUN.match(path.name)
        if match:
            level, problem, sample = match.groups()
            runs[(str(int(level)), str(int(problem)))].append((int(sample), path))
    return runs


def find_candidates(tasks: list[Task], solutions: Path, device: Device) -> tuple[list[Candidate], list[Task]]:
    """(candidates, tasks without any) for the tasks, from the solutions directory."""
    if not solutions.is_dir():
        raise FileNotFoundError(f"--solutions {solutions}: not a directory")
    runs = _kernelbench_runs(solutions)
    candidates: list[Candidate] = []
    missing: list[Task] = []
    for task in tasks:
        found: list[Candidate] = []
        for folder in (solutions / task.level / task.name, solutions / task.name):
            if folder.is_dir():
                found = _dir_candidates(task, folder, device)
                break
        if not found:
            for file in (solutions / task.level / f"{task.name}.py", solutions / f"{task.name}.py"):
                if file.is_file():
                    found = [Candidate(task, file)]
                    break
        problem = re.match(r"^(\d+)_", task.name)
        level = _level_number(task.level)
        if not found and problem and level:
            samples = sorted(runs.get((level, str(int(problem.group(1)))), []))
            labels = len(samples) > 1
            found = [Candidate(task, path, f"sample_{s}" if labels else None) for s, path in samples]
        candidates += found
        if not found:
            missing.append(task)
    return candidates, missing
