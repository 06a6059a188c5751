"""Which part may import which: the import-linter contracts in pyproject.toml ([tool.importlinter]; the
picture is docs/architecture.md's "Allowed imports") hold for every import in the `cuda_agent` namespace,
function-level imports included. A negative control shows the check sees the imports it must: contracts
that the code breaks today (one through a function-level import, two across the three component roots)
are reported broken, each with the import that breaks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_import_keeps_the_contracts() -> None:
    result = _lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout, result.stdout


def test_a_broken_rule_fails_and_names_the_import(tmp_path: Path) -> None:
    rules = {  # name: (source, forbidden), each broken today by a direct import of `forbidden` in `source`
        "function-level": ("cuda_agent.eval.policy", "cuda_agent.sandbox.local"),  # inside local_sandbox()
        "trainer-to-platform": ("cuda_agent.trainer.demonstrations", "cuda_agent.api.pool_server"),
        "platform-to-sandbox": ("cuda_agent.operator.local_executor", "cuda_agent.sandbox.local"),
    }
    config = tmp_path / "broken.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    cuda_agent\n\n"
        + "".join(
            f"[importlinter:contract:{name}]\nname = {name}\ntype = forbidden\n"
            f"source_modules =\n    {source}\nforbidden_modules =\n    {forbidden}\n\n"
            for name, (source, forbidden) in rules.items()
        )
    )
    result = _lint("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 0 kept, 3 broken." in result.stdout, result.stdout
    for source, forbidden in rules.values():
        assert f"{source} -> {forbidden} (l." in result.stdout, result.stdout


def test_the_operator_role_layers_catch_an_upward_import(tmp_path: Path) -> None:
    """The operator's role layers (contract operator-roles): with a reconciler placed below the pass context
    it imports, the layers contract reports that import. Also: the kept contract lists every module of the
    operator (exhaustive), so a new module must be given a role."""
    config = tmp_path / "layers.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    cuda_agent\n\n"
        "[importlinter:contract:upside-down]\nname = upside-down\ntype = layers\n"
        "containers =\n    cuda_agent.operator\nlayers =\n    context\n    run_reconciler\n"
    )
    result = _lint("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cuda_agent.operator.run_reconciler -> cuda_agent.operator.context" in result.stdout, result.stdout

    config.write_text(
        "[importlinter]\nroot_packages =\n    cuda_agent\n\n"
        "[importlinter:contract:missing]\nname = missing\ntype = layers\nexhaustive = true\n"
        "containers =\n    cuda_agent.operator\nlayers =\n    cli\n    handlers\n"
    )
    result = _lint("--config", str(config))
    assert result.returncode != 0, result.stdout + result.stderr
    assert "run_reconciler" in result.stdout + result.stderr, result.stdout + result.stderr
