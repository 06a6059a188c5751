"""Training tasks and the order they are drawn in.

The order is a function of (seed, position) alone: slot k of a stage is task perm_e[k mod N] with
e = k div N and perm_e a permutation seeded by (seed, e). A checkpoint stores only the position, and a
resumed run draws exactly the batch an uninterrupted run would have drawn.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cuda_agent.api.sandbox import TaskRef
from cuda_agent.storage import StorageConfig, open_store, parse_uri


def load_tasks(uri: str) -> list[TaskRef]:
    """KernelBench-format tasks (one `*.py` per task) under a local path, pvc:// or s3:// prefix."""
    location = parse_uri(uri)
    if location.scheme == "s3":
        store = open_store(uri)
        tasks = [
            TaskRef(uri=info.uri, name=Path(info.uri).stem)
            for info in store.list_objects(uri)
            if info.uri.endswith(".py")
        ]
    else:
        root = location.local_path(StorageConfig.from_env().pvc_root)
        files = [root] if root.is_file() else sorted(root.glob("*.py"))
        tasks = [TaskRef(source=f.read_text(), name=f.stem) for f in files]
    if not tasks:
        raise FileNotFoundError(f"spec.dataset.uri {uri}: no *.py task found")
    return tasks


class TaskOrder:
    """Seeded, epoch-by-epoch shuffled order of a task list, addressed by position."""

    def __init__(self, tasks: list[TaskRef], seed: int) -> None:
        self.tasks, self.seed = tasks, seed
        self._epoch, self._perm = -1, list[int]()

    def slot(self, position: int) -> TaskRef:
        epoch, index = divmod(position, len(self.tasks))
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(len(self.tasks), generator=generator).tolist()
        return self.tasks[self._perm[index]]

    def batch(self, position: int, size: int) -> list[TaskRef]:
        return [self.slot(position + i) for i in range(size)]
