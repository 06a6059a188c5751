"""The judge's file contract (cuda_agent.api.judge_files): one set of judge files and one hash, shared by
the operator (ConfigMap, pod annotation), the server (checked before every run) and the judge itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.api import judge_files as files
from cuda_agent.sandbox.judge import build, orchestrator
from cuda_agent.sandbox.server import judge_runner


def test_the_operator_imports_the_contract_without_torch() -> None:
    code = (
        "import sys, cuda_agent.operator.pool_reconciler, cuda_agent.operator.handlers; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_side_names_the_same_judge_directory_and_frozen_files() -> None:
    from cuda_agent.operator import pool_reconciler

    assert files.package_judge_dir() == orchestrator.JUDGE_DIR == Path(build.__file__).parent
    assert files.package_judge_dir() / files.FROZEN_SUBDIR == build.FROZEN_DIR
    assert all((build.FROZEN_DIR / name).is_file() for name in files.FROZEN_FILES)
    shipped = pool_reconciler.judge_files()
    assert "orchestrator.py" in shipped
    hashed = files.hash_judge_files(files.package_judge_dir())
    assert set(shipped) <= set(hashed)
    # The judge's contract modules in cuda_agent.api (outside its directory) are hashed with the judge.
    assert {files.JUDGE_CONTRACT_PREFIX + name for name in files.JUDGE_CONTRACT_MODULES} <= set(hashed)
    assert pool_reconciler.judge_files_hash() == files.shipped_digest(shipped)


def test_a_changed_added_removed_or_relinked_file_changes_the_hash(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "target.py").write_text("z = 3\n")
    os.symlink("target.py", tmp_path / "link.py")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0")
    baseline = files.hash_judge_dir(tmp_path)
    assert set(baseline) == {"a.py", "sub/b.py", "target.py", "link.py"}
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\1")  # bytecode caches are not the judge
    assert files.changed_paths(baseline, files.hash_judge_dir(tmp_path)) == []
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    (tmp_path / "new.py").write_text("")
    (tmp_path / "a.py").unlink()
    (tmp_path / "target.py").write_text("z = 4\n")  # the link's content changes with it
    changed = files.changed_paths(baseline, files.hash_judge_dir(tmp_path))
    assert changed == ["a.py", "link.py", "new.py", "sub/b.py", "target.py"]
    relinked = files.hash_judge_dir(tmp_path)
    (tmp_path / "other.py").write_text("z = 4\n")
    (tmp_path / "link.py").unlink()
    os.symlink("other.py", tmp_path / "link.py")
    assert "link.py" in files.changed_paths(relinked, files.hash_judge_dir(tmp_path))


def test_the_server_hashes_the_judge_with_the_contract(tmp_path: Path) -> None:
    assert files.hash_judge_dir(tmp_path / "missing") == {}
    (tmp_path / "judge.py").write_text("print(1)\n")
    assert judge_runner.hash_judge_files is files.hash_judge_files
    assert files.shipped_judge_files(tmp_path) == {"judge.py": "print(1)\n"}


def test_the_operator_ships_the_frozen_cpp_files() -> None:
    """Sessions in a pod copy frozen/binding.cpp and binding_registry.h from the shipped judge directory."""
    from cuda_agent.api.judge_files import (
        FROZEN_FILES,
        FROZEN_SUBDIR,
        package_judge_dir,
        shipped_judge_files,
    )

    shipped = shipped_judge_files(package_judge_dir())
    for name in FROZEN_FILES:
        assert f"{FROZEN_SUBDIR}/{name}" in shipped


def test_every_module_of_the_api_layer_a_judge_runs_is_hashed_with_the_judge() -> None:
    """What the judge's CLI, orchestrator and worker import from cuda_agent.api is among the judge's hashed
    files (JUDGE_CONTRACT_MODULES): an edit to any of it is judge-tampered like an edit to the judge."""
    code = (
        "import sys, json, cuda_agent.sandbox.judge.cli, cuda_agent.sandbox.judge.orchestrator, "
        "cuda_agent.sandbox.judge.worker; "
        "print(json.dumps([m.__file__ for n, m in sys.modules.items() if n.startswith('cuda_agent.api')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {Path(path).name for path in json.loads(out.stdout)}
    assert loaded <= set(files.JUDGE_CONTRACT_MODULES), loaded
    assert all(Path(path).parent == files.contract_dir() for path in json.loads(out.stdout))


def test_the_servers_writable_check_covers_the_contract_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's start-up warning names any judge file another uid could change: those under its judge
    directory and the judge's contract modules of cuda_agent.api (here a copy with one made writable)."""
    judge, contract = tmp_path / "judge", tmp_path / "api"
    judge.mkdir(mode=0o755)
    contract.mkdir()
    (judge / "cli.py").write_text("")
    os.chmod(judge / "cli.py", 0o644)
    for name in files.JUDGE_CONTRACT_MODULES:
        (contract / name).write_text("")
        os.chmod(contract / name, 0o644)
    monkeypatch.setattr(judge_runner, "contract_dir", lambda: contract)
    assert judge_runner.writable_judge_files(judge, "restricted") == []
    os.chmod(contract / "judge.py", 0o666)
    assert judge_runner.writable_judge_files(judge, "restricted") == [str(contract / "judge.py")]
