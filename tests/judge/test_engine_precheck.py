"""Pre-build checks (screen.precheck_candidate) and the released CUDA Agent workspace layout's static
side: problems a look at the sources finds are refused before any compiler runs, and what passes today
keeps passing. Fast: nothing here builds; the two CLI runs stop at the screen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_catalog import ATTACKS_DIR, TASKS_DIR, load_attack, load_attacks, load_solutions, materialise

from cuda_agent.sandbox.judge import build, policy, screen
from cuda_agent.sandbox.judge.config import OpPolicy

COMPUTE_OPS = policy.static_compute_ops(OpPolicy())

INLINE = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
static torch::Tensor helper(torch::Tensor x) { return BODY; }
torch::Tensor act(torch::Tensor x) { auto y = torch::empty_like(x); return helper(x); }
torch::Tensor unused(torch::Tensor x) { return torch::relu(x); }
"""
_ext = load_inline(name="pre_ext", cpp_sources=_CPP, functions=["act", "unused"])


class CLASS(nn.Module):
    def forward(self, x):
        return _ext.CALL(x)
'''


def candidate(tmp_path: Path, body: str = "x", cls: str = "ModelNew", call: str = "act") -> Path:
    root = tmp_path / "cand"
    root.mkdir(exist_ok=True)
    text = INLINE.replace("BODY", body).replace("CLASS", cls).replace("CALL", call)
    (root / "model_new.py").write_text(text)
    return root


def test_clean_candidate_has_no_findings(tmp_path: Path) -> None:
    result = screen.precheck_candidate(candidate(tmp_path), COMPUTE_OPS)
    assert result.errors == [] and result.violations == []


def test_missing_model_new_is_an_error_before_the_build(tmp_path: Path) -> None:
    result = screen.precheck_candidate(candidate(tmp_path, cls="ModelNewRenamed"), COMPUTE_OPS)
    assert result.errors == ["model_new.py defines no ModelNew class (found before the build)"]


def test_calling_a_function_the_extension_does_not_define_is_an_error(tmp_path: Path) -> None:
    result = screen.precheck_candidate(candidate(tmp_path, call="act_fast"), COMPUTE_OPS)
    assert len(result.errors) == 1
    assert "calls _ext.act_fast, but the extension defines no function 'act_fast'" in result.errors[0]
    assert "it defines: act, unused" in result.errors[0]


def test_names_the_scan_cannot_see_skip_the_missing_function_check(tmp_path: Path) -> None:
    """A binding whose names come from a macro is not proof that a function is missing."""
    root = tmp_path / "ws"
    (root / "kernels").mkdir(parents=True)
    (root / "model_new.py").write_text(
        "import cuda_extension\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return cuda_extension.scale(x)\n"
    )
    (root / "kernels" / "k_binding.cpp").write_text(
        '#include "binding_registry.h"\n#define DEF(n) m.def(#n, &n)\n'
        "torch::Tensor scale(torch::Tensor x) { return x; }\n"
        "REGISTER_BINDING(k, [](pybind11::module& m) { DEF(scale); });\n"
    )
    assert screen.precheck_candidate(root, COMPUTE_OPS).errors == []
    assert screen.bindings_named_literally('m.def("a", +[](int x) { return x; });')
    assert not screen.bindings_named_literally("m.def(name, &f);")


def test_torch_compute_reachable_from_a_used_function_is_refused(tmp_path: Path) -> None:
    result = screen.precheck_candidate(candidate(tmp_path, body="torch::sigmoid(x)"), COMPUTE_OPS)
    assert result.violations == [
        "torch-compute: aten::sigmoid (torch::sigmoid / at::sigmoid) reachable from the extension function "
        "'act' (found before the build; PyTorch compute is not a custom kernel)"
    ]
    # torch::relu sits in `unused`, which model_new.py never calls: not a finding (the attack kit's
    # shared binding holds such functions for other attacks).
    assert all("relu" not in v for v in result.violations)
    # Allowed ops (allocation, GEMM inside the extension) and comments are not findings.
    ok = candidate(tmp_path, body="at::matmul(x, x) /* torch::sigmoid(x) */")
    assert screen.precheck_candidate(ok, COMPUTE_OPS).violations == []


def test_torch_compute_written_in_forward_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "py"
    root.mkdir()
    (root / "model_new.py").write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport cuda_extension\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.w = torch.sigmoid(torch.ones(3))\n\n"
        "    def forward(self, x):\n        y = torch.empty_like(x)\n"
        "        return F.gelu(cuda_extension.op(x)) + torch.cat([y])\n"
    )
    result = screen.precheck_candidate(root, COMPUTE_OPS)
    assert result.violations == [
        "torch-compute: aten::gelu (torch.nn.functional.gelu in ModelNew.forward at model_new.py:14; "
        "found before the build; PyTorch compute is not a custom kernel)"
    ]


def test_bindings_both_forms_and_function_bodies() -> None:
    source = """
    #include "../binding_registry.h"
    torch::Tensor fwd(torch::Tensor x) { return x; }
    REGISTER_BINDING(axpby, fwd);
    REGISTER_BINDING(group, [](pybind11::module& m) {
        m.def("one", &fwd);
        m.def("two", [](int a) { return a; });
    });
    """
    bound = screen.cpp_bindings(source)
    assert bound["axpby"] == "=fwd" and bound["one"] == "=fwd" and "return a" in bound["two"]
    assert "group" not in bound
    assert "return x" in screen.cpp_functions(source)["fwd"]


def test_parent_include_inside_the_candidate_is_allowed_outside_it_is_not(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "common.h").write_text("#pragma once\n")
    ok = '#include "../binding_registry.h"\n#include "../common.h"\n'
    assert screen.screen_cpp(ok, "kernels/a_binding.cpp", tmp_path) == []
    for bad in (
        '#include "../../etc/passwd"\n',
        '#include "../config.py"\n',
        '#include "../binding_registry.h"\n',
    ):
        found = screen.screen_cpp(bad, "kernels/a_binding.cpp", tmp_path if "registry" not in bad else None)
        assert [f.split(":")[0] for f in found] == ["static.judge-access"], bad


def test_released_layout_gets_the_judges_frozen_files_at_its_root(tmp_path: Path) -> None:
    attack = load_attack(ATTACKS_DIR / "released_layout_cpu")
    root = materialise(attack, "cpu", tmp_path)
    assert (root / "binding_registry.h").read_text() != (build.FROZEN_DIR / "binding_registry.h").read_text()
    notes = build.remove_frozen_copies(root)
    assert sorted(notes) == [
        "candidate's binding.cpp replaced: the judge's frozen copy is used",
        "candidate's binding_registry.h replaced: the judge's frozen copy is used",
    ]
    assert screen.screen_tree(root) == []
    result = screen.precheck_candidate(root, COMPUTE_OPS)
    assert result.errors == [] and result.violations == []
    build.install_frozen_files(root)
    for name in build.FROZEN_FILES:
        assert (root / name).read_bytes() == (build.FROZEN_DIR / name).read_bytes()


def test_no_existing_solution_or_attack_changes_outcome_at_the_precheck(tmp_path: Path) -> None:
    """Every solution passes the pre-build checks; an attack they flag is flagged with a code it expects."""
    for solution in load_solutions():
        result = screen.precheck_candidate(solution.directory, COMPUTE_OPS)
        assert result.errors == [] and result.violations == [], solution.name
    for attack in load_attacks():
        for device in attack.devices:
            found = materialise(attack, device, tmp_path / device)
            root = found if found.is_dir() else found.parent
            build.remove_frozen_copies(root)
            if screen.screen_tree(root):
                continue
            result = screen.precheck_candidate(root, COMPUTE_OPS)
            assert result.errors == [], attack.name
            codes = {v.split(":")[0] for v in result.violations}
            assert not codes or codes & set(attack.expected), (attack.name, result.violations)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ({"cls": "ModelNewRenamed"}, "model_new.py defines no ModelNew class (found before the build)"),
        ({"body": "torch::sigmoid(x)"}, "torch-compute: aten::sigmoid"),
    ],
)
def test_cli_refuses_before_any_build(tmp_path: Path, variant: dict[str, str], expected: str) -> None:
    """Through the real CLI: refused in seconds with nothing built (no `build` step in the breakdown)."""
    root = candidate(tmp_path, **variant)
    proc = subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.judge.cli", str(TASKS_DIR / "relu_mul_add.py"),
         str(root / "model_new.py"), "--device", "cpu", "--compile-mode", "none", "--json",
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["reward"] == -1 and report["compiled"] is False
    assert expected in (report["error"] or "") + " ".join(report["violations"])
    assert "build" not in report["steps_s"]
    assert not any((tmp_path / "cache" / "obj").rglob("*.o"))
