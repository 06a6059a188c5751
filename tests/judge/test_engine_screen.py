"""The static screen: each violation code from a minimal snippet, and legitimate code that must pass."""

from __future__ import annotations

import pytest

from cuda_agent.sandbox.judge import screen

LEGIT_INLINE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = """
#include <torch/extension.h>
torch::Tensor relu2(torch::Tensor x) { return x; }
"""
ext = load_inline(name="relu2_ext", cpp_sources=[cpp], functions=["relu2"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(features, features))
        self.cache = {}

    def forward(self, x):
        out = torch.empty_like(x)
        self.cache["last"] = out.shape
        return ext.relu2(x.contiguous())
'''

LEGIT_CUDA = r"""
#include <cuda_runtime.h>
#include "common.cuh"
// std::thread in a comment does not count, nor does "system(" in a string
template <typename T>
__global__ void __launch_bounds__(256) relu_kernel(const T* in, T* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] > T(0) ? in[i] : T(0);
}
extern "C" __global__ void scale_kernel(float* x) {}
void launch(const float* in, float* out, int n, cudaStream_t stream) {
  auto f = std::bind(launch, in, out, n, stream);
  relu_kernel<float><<<(n + 255) / 256, 256, 0, stream>>>(in, out, n);
}
"""


def codes(findings: list[str]) -> set[str]:
    return {f.split(":")[0] for f in findings}


def test_legitimate_inline_candidate_passes() -> None:
    assert screen.screen_python(LEGIT_INLINE, "model_new.py") == []


def test_legitimate_cuda_source_passes_and_kernels_are_found() -> None:
    assert screen.screen_cpp(LEGIT_CUDA, "kernels/relu.cu") == []
    assert screen.global_kernels([LEGIT_CUDA]) == ["relu_kernel", "scale_kernel"]


@pytest.mark.parametrize(
    ("snippet", "code"),
    [
        ("import threading\n", "static.thread"),
        ("from concurrent.futures import ThreadPoolExecutor\n", "static.thread"),
        ("import subprocess\n", "static.process"),
        ("import os\nos.system('ls')\n", "static.process"),
        ("import os\nos.fork()\n", "static.process"),
        ("import socket\n", "static.socket"),
        ("import ctypes\n", "static.ctypes"),
        ("import torch\ntorch.ops.load_library('x.so')\n", "static.ctypes"),
        ("import time\ntime.perf_counter = lambda: 0.0\n", "static.monkeypatch"),
        ("import torch\ntorch.allclose = lambda *a, **k: True\n", "static.monkeypatch"),
        ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", "static.monkeypatch"),
        ("import torch\nsetattr(torch, 'equal', None)\n", "static.monkeypatch"),
        ("import sys\nsys.modules['x'] = None\n", "static.monkeypatch"),
        ("from model import Model\nModel.forward = None\n", "static.monkeypatch"),
        ("import torch\ndel torch.cuda.synchronize\n", "static.monkeypatch"),
        ("import torch\ntorch.nn.modules.module.register_module_forward_hook(print)\n", "static.monkeypatch"),
        ("import torch.overrides\n", "static.monkeypatch"),
        ("x = 1\nx.__class__ = int\n", "static.monkeypatch"),
        ("try:\n    pass\nexcept Exception:\n    pass\n", "static.try-except"),
        ("class Quiet:\n    def __exit__(self, *a):\n        return True\n", "static.try-except"),
        ("from model import Model\nclass ModelNew(Model):\n    pass\n", "static.inherits-model"),
        ("import model\nclass ModelNew(model.Model):\n    pass\n", "static.inherits-model"),
        (
            "class Model:\n    pass\nclass A(Model):\n    pass\nclass ModelNew(A):\n    pass\n",
            "static.inherits-model",
        ),
        ("import gc\n", "static.introspection"),
        ("import inspect\n", "static.introspection"),
        ("import importlib\n", "static.introspection"),
        ("import builtins\n", "static.introspection"),
        ("import sys\nsys._getframe(1)\n", "static.introspection"),
        ("def f():\n    pass\nf.__code__\n", "static.introspection"),
        ("def f():\n    pass\nf.__globals__['x'] = 1\n", "static.introspection"),
        ("globals()['x'] = 1\n", "static.introspection"),
        ("exec('print(1)')\n", "static.introspection"),
        ("eval('1')\n", "static.introspection"),
        ("getattr(object, 'a' + 'b')\n", "static.introspection"),
        ("open('/etc/passwd').read()\n", "static.introspection"),
        ("import os\nos.environ['X']\n", "static.introspection"),
        ("import torch\ntorch._C._set_grad_enabled(True)\n", "static.introspection"),
        ("import sys\nsys.setprofile(None)\n", "static.introspection"),
        ("import cuda_agent\n", "static.judge-access"),
        ("from cuda_agent.sandbox.judge import worker\n", "static.judge-access"),
        ("path = '/proc/self/maps'\n", "static.judge-access"),
        ("import numpy\n", "static.import"),
        ("import cupy\n", "static.import"),
        ("import torch\ntorch.compile(lambda x: x)\n", "torch-compute"),
        ("import torch._dynamo\n", "torch-compute"),
    ],
)
def test_python_snippet_is_flagged(snippet: str, code: str) -> None:
    findings = screen.screen_python(snippet, "model_new.py")
    assert code in codes(findings), findings


def test_findings_name_file_and_line() -> None:
    findings = screen.screen_python("import torch\n\nimport threading\n", "pkg/model_new.py")
    assert findings == ["static.thread: imports threading at pkg/model_new.py:3"]


def test_local_modules_and_exit_are_not_flagged() -> None:
    source = "import helpers\nimport os\nos._exit(0)\n"
    assert screen.screen_python(source, "model_new.py", local_modules={"helpers"}) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "#include <thread>\n",
        "void f() { std::thread t([]{}); }\n",
        "void f() { pthread_create(0, 0, 0, 0); }\n",
        "#pragma omp parallel for\n",
        'void f() { system("ls"); }\n',
        'void f() { ::popen("ls", "r"); }\n',
        "void f() { fork(); }\n",
        "void f() { int s = socket(1, 2, 3); }\n",
        'void f() { dlopen("x", 0); }\n',
        "void f() { ptrace(0, 0, 0, 0); }\n",
        'const char* p = "/proc/self/mem";\n',
        'void f() { PyRun_SimpleString("import os"); }\n',
        "void f(at::Tensor x) { at::native::relu(x); }\n",
        "void f() { c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python); }\n",
        "void f() { at::globalContext().setAllowTF32CuBLAS(true); }\n",
        # Aliases of the process-wide context (issue 30): the setter is reached through a reference.
        "void f() { auto& ctx = at::globalContext(); ctx.setUserEnabledCuDNN(false); }\n",
        "void f() { at::Context& ctx = at::globalContext(); ctx.setSDPUseFlash(false); }\n",
        "static at::Context* ctx = &at::globalContext;\n",
        "void f(at::Context& c) { c.setBenchmarkCuDNN(true); }\n",
        "void f(cudaStream_t s) { cudaLaunchHostFunc(s, cb, nullptr); }\n",
        "void f(cudaStream_t s) { cudaStreamAddCallback(s, cb, nullptr, 0); }\n",
        'void f() { getenv("HOME"); }\n',
    ],
)
def test_cpp_snippet_is_flagged(snippet: str) -> None:
    assert "static.cpp" in codes(screen.screen_cpp(snippet, "kernels/k.cu")), snippet


def test_cpp_include_outside_candidate_is_judge_access() -> None:
    findings = screen.screen_cpp('#include "../../judge/worker.py"\n', "kernels/k.cu")
    assert codes(findings) == {"static.judge-access"}


def test_cpp_comments_and_strings_do_not_count() -> None:
    source = '// fork() system() std::thread\n/* dlopen */\nconst char* s = "fork() and system()";\n'
    assert screen.screen_cpp(source, "k.cu") == []


def test_embedded_cpp_in_python_strings_is_screened() -> None:
    source = 'src = """\n#include <torch/extension.h>\nvoid f() { system("rm -rf /"); }\n"""\n'
    assert "static.cpp" in codes(screen.screen_python(source, "model_new.py"))


@pytest.mark.parametrize(
    ("kind", "flags", "allowed"),
    [
        ("cxx", ["-O3", "-march=native", "-DFOO=1", "-std=c++17", "-Wall"], True),
        ("cxx", ["-fplugin=/tmp/evil.so"], False),
        ("cxx", ["-fopenmp"], False),
        ("cxx", ["-B/tmp"], False),
        ("cxx", ["-include", "/etc/passwd"], False),
        ("cxx", ["@/tmp/response"], False),
        ("cuda", ["-O3", "--use_fast_math", "-Xptxas", "-v", "-arch=sm_90a", "-lineinfo"], True),
        ("cuda", ["-Xcompiler", "-O3,-fPIC"], True),
        ("cuda", ["-ccbin=/tmp/evil"], False),
        ("cuda", ["-Xcompiler", "-fplugin=/tmp/evil.so"], False),
        ("ld", ["-lcublas", "-lcublasLt"], True),
        ("ld", ["-ldl"], False),
        ("ld", ["-Wl,-rpath,/tmp"], False),
    ],
)
def test_compiler_flags(kind: str, flags: list[str], allowed: bool) -> None:
    findings = screen.screen_flags(kind, flags, "extension 'x'")
    assert (findings == []) is allowed, findings


def test_rules_apply_to_every_prefix_of_an_attribute_chain() -> None:
    findings = screen.screen_python("import os\nseed = os.environ.get('SEED', '0')\n", "model_new.py")
    assert codes(findings) == {"static.introspection"}
    findings = screen.screen_python("import sys\nsys.modules.get('torch')\n", "model_new.py")
    assert codes(findings) == {"static.monkeypatch"}
