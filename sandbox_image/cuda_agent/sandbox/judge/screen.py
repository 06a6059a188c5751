"""Static screen of every candidate source before anything is built or run.

Python is screened on its AST (imports, attribute chains, assignments, calls); C, C++ and CUDA with a
token scan over source whose comments and string contents are removed. A finding is a violation string
"<code>: <detail> at <file>:<line>". The screen is the first line only: what static analysis cannot see
(streams, dynamic tricks) is caught at run time by the worker's recorders and the tamper checks.
"""

from __future__ import annotations

import ast
import itertools
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.api.judge_files import FROZEN_FILES

# Top-level modules a candidate may import; anything else is `static.import` unless a specific code applies.
ALLOWED_IMPORTS = frozenset(
    {
        "torch", "math", "typing", "typing_extensions", "functools", "itertools", "collections",
        "dataclasses", "enum", "abc", "numbers", "operator", "__future__", "os", "sys", "pathlib",
        "time", "re", "string", "textwrap", "cuda_extension",
    }
)  # fmt: skip
IMPORT_CODES: dict[str, str] = {
    **dict.fromkeys(("threading", "_thread", "concurrent", "asyncio", "queue", "sched"), "static.thread"),
    **dict.fromkeys(
        ("subprocess", "multiprocessing", "pty", "signal", "resource", "shlex", "pexpect"), "static.process"
    ),
    **dict.fromkeys(
        (
            "socket", "ssl", "http", "urllib", "urllib3", "requests", "ftplib", "smtplib", "xmlrpc",
            "socketserver", "select", "selectors", "asyncore", "telnetlib", "websocket", "zmq",
        ),
        "static.socket",
    ),
    **dict.fromkeys(("ctypes", "_ctypes", "cffi", "mmap"), "static.ctypes"),
    **dict.fromkeys(
        (
            "gc", "inspect", "importlib", "builtins", "__builtin__", "code", "codeop", "dis", "types",
            "traceback", "pickle", "marshal", "copyreg", "runpy", "pkgutil", "sysconfig", "site",
            "tracemalloc", "faulthandler", "atexit", "weakref", "linecache", "ast", "ctypes.util",
        ),
        "static.introspection",
    ),
    "cuda_agent": "static.judge-access",
}  # fmt: skip
# torch sub-modules that are a second compiler or a hook into the dispatcher, not a kernel.
TORCH_COMPILERS = (
    "torch.compile",
    "torch.jit",
    "torch._dynamo",
    "torch._inductor",
    "torch.fx",
    "torch.export",
)
TORCH_HOOKS = ("torch.overrides", "torch.library", "torch.utils._python_dispatch", "torch.utils.hooks")

INTROSPECTION_NAMES = frozenset(
    {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "breakpoint"}
)
DANGEROUS_DUNDERS = frozenset(
    {
        "__code__", "__globals__", "__builtins__", "__import__", "__subclasses__", "__bases__", "__mro__",
        "__dict__", "__closure__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__", "__setattr__",
        "__delattr__", "__getattribute__", "__func__", "__self__", "__kwdefaults__", "__defaults__",
    }
)  # fmt: skip
FRAME_ATTRS = frozenset(
    {"f_globals", "f_locals", "f_back", "f_code", "f_builtins", "gi_frame", "cr_frame", "tb_frame", "co_code"}
)
SYS_INTROSPECTION = frozenset(
    {
        "sys._getframe", "sys.settrace", "sys.setprofile", "sys.gettrace", "sys.getprofile", "sys.meta_path",
        "sys.path_hooks", "sys.path_importer_cache", "sys._current_frames", "sys.addaudithook",
        "sys.setrecursionlimit", "sys.call_tracing", "sys.monitoring",
    }
)  # fmt: skip
ENV_NAMES = frozenset({"os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv", "os.getenvb"})
PROCESS_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "os.wait")
PROCESS_NAMES = frozenset(
    {
        "os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.setsid", "os.setpgid",
        "os.setpgrp", "os.abort", "os.pidfd_open", "os.register_at_fork", "os.plock", "os.startfile",
    }
)  # fmt: skip
# Private attributes that are fine to touch: exiting is caught at run time as early-exit.
PRIVATE_EXEMPT = frozenset({"os._exit"})
PROTECTED_ROOTS = frozenset({"Model", "get_inputs", "get_init_inputs", "__builtins__"})
EMBEDDED_CPP_MARKERS = ("__global__", "#include", "PYBIND11", "TORCH_LIBRARY", "<<<")
JUDGE_PATH_MARKERS = ("/proc/", "/dev/mem", "cuda_agent", "sandbox/judge", "judge-build")


@dataclass
class _Scope:
    """Names the screened module bound by import: local alias -> dotted origin."""

    aliases: dict[str, str] = field(default_factory=dict)
    model_like: set[str] = field(default_factory=lambda: {"Model"})


def _dotted(node: ast.AST, scope: _Scope) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    root = scope.aliases.get(node.id, node.id)
    return ".".join([root, *reversed(parts)])


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _private_component(dotted: str) -> bool:
    """`torch._C`, `torch.cuda._lazy_init`: a private attribute of a module (lower-case parent)."""
    parts = dotted.split(".")
    for parent, part in itertools.pairwise(parts):
        if part.startswith("_") and not _is_dunder(part) and parent[:1].islower():
            return True
    return False


class _PythonScreen(ast.NodeVisitor):
    def __init__(self, filename: str, local_modules: frozenset[str]) -> None:
        self.filename = filename
        self.local_modules = local_modules
        self.scope = _Scope()
        self.findings: list[str] = []
        self.embedded_cpp: list[tuple[int, str]] = []

    def _add(self, code: str, detail: str, node: ast.AST) -> None:
        self.findings.append(f"{code}: {detail} at {self.filename}:{getattr(node, 'lineno', 0)}")

    # -- imports ---------------------------------------------------------------------------------------
    def _check_module(self, module: str, node: ast.AST) -> None:
        top = module.split(".")[0]
        if top in IMPORT_CODES or module in IMPORT_CODES:
            self._add(
                IMPORT_CODES.get(module, IMPORT_CODES.get(top, "static.import")), f"imports {module}", node
            )
        elif module.startswith(TORCH_COMPILERS):
            self._add("torch-compute", f"imports {module} (a second compiler, not a custom kernel)", node)
        elif module.startswith(TORCH_HOOKS):
            self._add("static.monkeypatch", f"imports {module} (hooks into the dispatcher)", node)
        elif _private_component(module):
            self._add("static.introspection", f"imports private module {module}", node)
        elif top not in ALLOWED_IMPORTS and top not in self.local_modules:
            self._add("static.import", f"imports {module} (only torch, the extension and basic stdlib)", node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)
            if alias.asname:
                self.scope.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.scope.aliases[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if node.level == 0:
            self._check_module(module, node)
        for alias in node.names:
            full = f"{module}.{alias.name}" if module else alias.name
            if node.level == 0 and alias.name != "*":
                self._check_dotted(full, node)
            local = alias.asname or alias.name
            self.scope.aliases[local] = full
            if alias.name == "Model":
                self.scope.model_like.add(local)
        self.generic_visit(node)

    # -- names and attribute chains --------------------------------------------------------------------
    def _check_dotted(self, dotted: str, node: ast.AST) -> None:
        """Rules apply to the chain and every prefix of it: `os.environ.get` is a use of `os.environ`."""
        if dotted in PRIVATE_EXEMPT:
            return
        parts = dotted.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if dotted.startswith(TORCH_COMPILERS):
            self._add("torch-compute", f"uses {dotted} (a second compiler, not a custom kernel)", node)
        elif dotted.startswith(TORCH_HOOKS):
            self._add("static.monkeypatch", f"uses {dotted} (hooks into the dispatcher)", node)
        elif "sys.modules" in prefixes:
            self._add("static.monkeypatch", "touches sys.modules", node)
        elif prefixes & SYS_INTROSPECTION:
            self._add("static.introspection", f"uses {dotted}", node)
        elif prefixes & ENV_NAMES:
            self._add("static.introspection", f"reads {dotted}", node)
        elif prefixes & PROCESS_NAMES or any(p.startswith(PROCESS_PREFIXES) for p in prefixes):
            self._add("static.process", f"uses {dotted}", node)
        elif prefixes & {"torch.ops.load_library", "torch.classes.load_library"}:
            self._add("static.ctypes", f"uses {dotted} (loads native code outside the build)", node)
        elif ".register_module_" in dotted:
            self._add("static.monkeypatch", f"uses {dotted} (a global module hook)", node)
        elif _private_component(dotted):
            self._add("static.introspection", f"uses private {dotted}", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # A chain `a.b.c` is checked once, as a whole and component by component; its root is then
        # visited like any other expression (a Name, or a call/subscript whose result is dereferenced).
        root: ast.AST = node
        while isinstance(root, ast.Attribute):
            if root.attr in DANGEROUS_DUNDERS or root.attr in FRAME_ATTRS:
                self._add("static.introspection", f"accesses .{root.attr}", root)
            root = root.value
        dotted = _dotted(node, self.scope)
        if dotted is not None and isinstance(node.ctx, ast.Load):
            self._check_dotted(dotted, node)
        self.visit(root)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DANGEROUS_DUNDERS:
            self._add("static.introspection", f"uses {node.id}", node)
        elif isinstance(node.ctx, ast.Load) and node.id in self.scope.aliases:
            self._check_dotted(self.scope.aliases[node.id], node)
        elif node.id in INTROSPECTION_NAMES and isinstance(node.ctx, ast.Load):
            self._add("static.introspection", f"uses {node.id}()", node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if any(marker in node.value for marker in JUDGE_PATH_MARKERS):
                marker = next(m for m in JUDGE_PATH_MARKERS if m in node.value)
                self._add("static.judge-access", f"string mentions {marker!r}", node)
            if any(marker in node.value for marker in EMBEDDED_CPP_MARKERS):
                self.embedded_cpp.append((node.lineno, node.value))

    # -- calls -----------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            target, attr = node.args[0], node.args[1]
            if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                self._add("static.introspection", f"{name}() with a computed attribute name", node)
            else:
                base = _dotted(target, self.scope) or ""
                dotted = f"{base}.{attr.value}" if base else attr.value
                if attr.value in DANGEROUS_DUNDERS or attr.value in FRAME_ATTRS:
                    self._add("static.introspection", f"{name}() of {attr.value}", node)
                elif name in ("setattr", "delattr") and self._protected_root(target):
                    self._add("static.monkeypatch", f"{name}() on {base or 'a module'}", node)
                else:
                    self._check_dotted(dotted, node)
        elif name == "open" and node.args:
            path = node.args[0]
            literal = path.value if isinstance(path, ast.Constant) and isinstance(path.value, str) else None
            if literal is not None and (literal.startswith(("/", "~")) or ".." in literal.split("/")):
                self._add("static.introspection", f"opens {literal!r} outside the candidate dir", node)
        self.generic_visit(node)

    # -- writes ----------------------------------------------------------------------------------------
    def _protected_root(self, node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        if not isinstance(node, ast.Name):
            return False
        return node.id in self.scope.aliases or node.id in PROTECTED_ROOTS or node.id in self.scope.model_like

    def _check_target(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt, node)
            return
        if isinstance(target, ast.Starred):
            self._check_target(target.value, node)
            return
        if isinstance(target, ast.Attribute) and target.attr == "__class__":
            self._add("static.monkeypatch", "assigns __class__", node)
        elif isinstance(target, (ast.Attribute, ast.Subscript)) and self._protected_root(target):
            where = _dotted(target, self.scope) if isinstance(target, ast.Attribute) else None
            self._add("static.monkeypatch", f"assigns {where or 'into an imported object'}", node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target, node)
        self.generic_visit(node)

    # -- control flow and classes ----------------------------------------------------------------------
    def visit_Try(self, node: ast.Try) -> None:
        self._add("static.try-except", "try statement (fallback paths are not allowed)", node)
        self.generic_visit(node)

    def visit_TryStar(self, node: ast.TryStar) -> None:
        self._add("static.try-except", "try statement (fallback paths are not allowed)", node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            dotted = _dotted(base, self.scope) or ""
            if (
                dotted == "Model"
                or dotted.endswith(".Model")
                or dotted.split(".")[0] in self.scope.model_like
            ):
                self._add("static.inherits-model", f"class {node.name} derives from the task's Model", node)
                self.scope.model_like.add(node.name)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in (
                "__exit__",
                "__aexit__",
            ):
                self._add("static.try-except", f"{node.name}.{item.name} can swallow exceptions", item)
        self.generic_visit(node)


def screen_python(source: str, filename: str, local_modules: Iterable[str] = ()) -> list[str]:
    """Violations in one Python file (a file that does not parse has none: its import fails later)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return []
    screen = _PythonScreen(filename, frozenset(local_modules))
    screen.visit(tree)
    for lineno, text in screen.embedded_cpp:
        screen.findings.extend(screen_cpp(text, f"{filename}:{lineno} (embedded source)"))
    return list(dict.fromkeys(screen.findings))


# --- C, C++ and CUDA -------------------------------------------------------------------------------------


def strip_cpp(source: str) -> tuple[str, list[tuple[int, str]]]:
    """(code with comments and string/char contents blanked, [(line, string literal)]); lines are kept."""
    out: list[str] = []
    strings: list[tuple[int, str]] = []
    i, n, line = 0, len(source), 1
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
            continue
        if source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            newlines = source.count("\n", i, j)
            out.append("\n" * newlines)
            line += newlines
            i = j
            continue
        raw = re.match(r'R"([^()\\ ]{0,16})\(', source[i : i + 20])
        if raw:
            end_marker = ")" + raw.group(1) + '"'
            j = source.find(end_marker, i + raw.end())
            j = n if j < 0 else j + len(end_marker)
            text = source[i + raw.end() : max(i + raw.end(), j - len(end_marker))]
            strings.append((line, text))
            newlines = source.count("\n", i, j)
            out.append('""' + "\n" * newlines)
            line += newlines
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            if c == '"':
                strings.append((line, source[i + 1 : j]))
            out.append(c + c)
            i = j + 1
            continue
        if c == "\n":
            line += 1
        out.append(c)
        i += 1
    return "".join(out), strings


# A call of the global/std function, not a member or another namespace's function of the same name.
_ANY_CALL = r"(?:\bstd\s*::\s*|(?<![\w.>:])::\s*|(?<![\w.>:]))"
_GLOBAL_CALL = r"(?:(?<![\w.>:])::\s*|(?<![\w.>:]))"
CPP_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "threads",
        re.compile(
            r"\bstd\s*::\s*(?:thread|jthread|async)\b|\bpthread_create\b|#\s*pragma\s+omp\b|\bomp_set_num_threads\b"
        ),
    ),
    (
        "process control",
        re.compile(
            _ANY_CALL + r"(?:fork|vfork|system|popen|execl|execlp|execle|execv|execvp|execvpe|execve|fexecve"
            r"|posix_spawnp?|kill|setsid|daemon|raise)\s*\("
        ),
    ),
    (
        "sockets",
        re.compile(
            _GLOBAL_CALL + r"(?:socket|connect|bind|listen|accept|getaddrinfo|gethostbyname|socketpair)\s*\("
        ),
    ),
    ("dynamic loading", re.compile(r"\b(?:dlopen|dlsym|dlmopen|dlvsym)\b")),
    ("ptrace / foreign memory", re.compile(r"\b(?:ptrace|process_vm_readv|process_vm_writev)\b")),
    (
        "raw system calls",
        re.compile(
            _GLOBAL_CALL + r"(?:syscall|mprotect|memfd_create|prctl|seccomp|setrlimit|chmod|unlink)\s*\("
        ),
    ),
    ("environment access", re.compile(r"\b(?:getenv|setenv|putenv|unsetenv|secure_getenv)\b|\benviron\b")),
    (
        "embedded Python",
        re.compile(
            r"\bPyRun_\w+|\bPyImport_\w+|\bPyEval_(?!SaveThread|RestoreThread)\w+|\bPySys_\w+|\bPyObject_SetAttr\w*"
            r"|\b(?:py|pybind11)\s*::\s*(?:exec|eval|eval_file|globals)\b"
            r"|\b(?:py|pybind11)\s*::\s*module_?\s*::\s*import\b"
        ),
    ),
    (
        "dispatcher bypass",
        re.compile(
            r"\bat\s*::\s*native\s*::|\bat\s*::\s*cpu\s*::|\bat\s*::\s*redispatch\s*::|::\s*redispatch\b"
            r"|\b(?:ExcludeDispatchKeyGuard|IncludeDispatchKeyGuard|AutoDispatchBelowAutograd"
            r"|AutoDispatchBelowADInplaceOrView|AutoDispatchSkipFunctionalize|_force_tls_local_dispatch_key_set"
            r"|tls_set_dispatch_key_excluded|tls_set_dispatch_key_included|LocalDispatchKeySet)\b"
        ),
    ),
    (
        "profiler/record-function tampering",
        re.compile(r"\b(?:DisableRecordFunctionGuard|RecordFunctionGuard|clearCallbacks|removeCallback)\b"),
    ),
    (
        "global precision switches",
        re.compile(r"\bsetAllowTF32\w*|\bsetFloat32MatmulPrecision\b|\bsetAllow\w*Reduction\w*"),
    ),
    # Any use of ATen's process-wide context, an alias of it included (`auto& ctx = at::globalContext();
    # ctx.setUserEnabledCuDNN(false)`): kernels have nothing to read or write there. A name the token
    # scan cannot see (built by `##`) still meets the run-time check, which reads every setting by value
    # before each baseline call (backend_state, worker.BaselineGuard).
    ("process-wide ATen context", re.compile(r"\bglobalContext\b|\bat\s*::\s*Context\b")),
    # A host function queued on a stream runs on a driver thread later, possibly while a baseline is
    # being dispatched: candidate code outside its own call.
    (
        "stream host callbacks",
        re.compile(r"\b(?:cudaLaunchHostFunc|cudaStreamAddCallback|cuLaunchHostFunc|cuStreamAddCallback)\b"),
    ),
    ("binary inclusion", re.compile(r"\.incbin\b|#\s*embed\b")),
]
FORBIDDEN_SYSTEM_HEADERS = re.compile(
    r"^(?:thread|future|pthread\.h|omp\.h|sys/socket\.h|netinet/.*|arpa/inet\.h|netdb\.h|dlfcn\.h|sys/ptrace\.h"
    r"|spawn\.h|sys/syscall\.h|sys/prctl\.h|sys/mman\.h|linux/.*|seccomp\.h)$"
)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]*)[>"]', re.MULTILINE)


def _include_inside(root: Path, filename: str, path: str) -> bool:
    """A relative `..` include that stays inside the candidate directory and names a file there (or the
    judge's frozen header at the root): `#include "../binding_registry.h"` from kernels/."""
    target = posixpath.normpath(posixpath.join(posixpath.dirname(filename), path))
    if target.startswith(("../", "/")) or target == "..":
        return False
    return target in FROZEN_FILES or (root / target).is_file()


def screen_cpp(source: str, filename: str, root: Path | None = None) -> list[str]:
    """Violations in one C/C++/CUDA source (comments and string contents do not count). With `root`,
    `filename` is relative to the candidate directory and includes that stay inside it are allowed."""
    code, strings = strip_cpp(source)
    findings: list[str] = []

    def line_of(pos: int) -> int:
        return code.count("\n", 0, pos) + 1

    for what, rule in CPP_RULES:
        for match in rule.finditer(code):
            findings.append(
                f"static.cpp: {what} ({match.group(0).strip()}) at {filename}:{line_of(match.start())}"
            )
    uncommented, _ = strip_cpp(source.replace('"', "\x00"))
    for match in INCLUDE.finditer(uncommented.replace("\x00", '"')):
        kind, path = match.group(1), match.group(2)
        lineno = line_of(match.start())
        if path.startswith("/") or (
            ".." in path.split("/")
            and not (kind == '"' and root is not None and _include_inside(root, filename, path))
        ):
            findings.append(
                f"static.judge-access: #include {path!r} outside the candidate dir at {filename}:{lineno}"
            )
        elif kind == "<" and FORBIDDEN_SYSTEM_HEADERS.match(path):
            findings.append(f"static.cpp: forbidden header <{path}> at {filename}:{lineno}")
    for lineno, text in strings:
        if "/proc/" in text or "/dev/mem" in text:
            findings.append(f"static.cpp: string {text[:40]!r} reaches /proc at {filename}:{lineno}")
        elif any(marker in text for marker in JUDGE_PATH_MARKERS):
            findings.append(
                f"static.judge-access: string {text[:40]!r} names judge files at {filename}:{lineno}"
            )
    return list(dict.fromkeys(findings))


GLOBAL_KERNEL = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+|inline\s+|__forceinline__\s+)*"
    r"(?:void)\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\("
)


def global_kernels(sources: Iterable[str]) -> list[str]:
    """Names of the `__global__` functions in CUDA sources: the kernels whose launches count as evidence."""
    names: list[str] = []
    for source in sources:
        code, _ = strip_cpp(source)
        names.extend(m.group(1) for m in GLOBAL_KERNEL.finditer(code))
    return sorted(set(names))


# --- compiler flags ----------------------------------------------------------------------------------------

_GCC_DENIED_F = re.compile(
    r"^-f(?:no-)?(?:plugin|openmp|openacc|profile|dump|auto-profile|sanitize|tree-parallelize|record-gcc"
    r"|save-temps|instrument|exec-charset|input-charset|debug-prefix|file-prefix|macro-prefix)"
)
_GCC_ALLOWED = re.compile(
    r"^(?:-O[0-3sgz]?|-Ofast|-g[0-3]?|-std=(?:c|gnu)\+\+(?:1[147]|2[03b]|2a)|-D[A-Za-z_]\w*(?:=[\w.+-]*)?"
    r"|-U[A-Za-z_]\w*|-W(?!l,|a,|p,)[\w=+-]+|-w|-f[\w=+-]+|-m[\w=.+-]+|-DNDEBUG)$"
)
_NVCC_ALLOWED = re.compile(
    r"^(?:-O[0-3]|-lineinfo|-g|-G|--?use_fast_math|--ftz=(?:true|false)|--prec-div=(?:true|false)"
    r"|--prec-sqrt=(?:true|false)|--fmad=(?:true|false)|-maxrregcount=?\d+|--maxrregcount=?\d+"
    r"|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda|-std=c\+\+(?:1[47]|20)"
    r"|-D[A-Za-z_]\w*(?:=[\w.+-]*)?|-U[A-Za-z_]\w*|-w|-Wno-deprecated-gpu-targets|--resource-usage|-res-usage"
    r"|--diag-suppress=[\w,]+|-Xptxas=[-\w=,.]+|--ptxas-options=[-\w=,.]+|-arch=(?:sm|compute)_\d+a?"
    r"|--gpu-architecture=(?:sm|compute)_\d+a?|-gencode=arch=compute_\d+a?,code=(?:sm|compute)_\d+a?"
    r"|--generate-code=arch=compute_\d+a?,code=(?:sm|compute)_\d+a?|--threads=?\d+|-t\d+|--default-stream=per-thread)$"
)
_PTXAS_VALUE = re.compile(r"^[-\w=,.]+$")
_LDFLAGS_ALLOWED = re.compile(r"^-l(?:cublas|cublasLt|curand|cufft|cusparse|cusolver|cudnn|cuda|m)$")


def screen_flags(kind: str, flags: Sequence[str], where: str) -> list[str]:
    """Compiler/linker flags a candidate passes to load_inline: only code-generation flags are allowed
    (never -fplugin, -B, -ccbin, -include, response files or linker scripts: they run or read arbitrary
    files in the trusted build)."""
    findings: list[str] = []
    items = [f.strip() for f in flags if f.strip()]
    i = 0
    while i < len(items):
        flag = items[i]
        ok = False
        if kind == "cxx":
            ok = bool(_GCC_ALLOWED.match(flag)) and not _GCC_DENIED_F.match(flag)
        elif kind == "cuda":
            if flag in ("-Xcompiler", "-Xptxas") and i + 1 < len(items):
                value = items[i + 1]
                inner = value.split(",") if flag == "-Xcompiler" else [value]
                ok = all(
                    (_GCC_ALLOWED.match(v) and not _GCC_DENIED_F.match(v))
                    if flag == "-Xcompiler"
                    else _PTXAS_VALUE.match(v)
                    for v in inner
                )
                i += 1
                flag = f"{flag} {value}"
            elif flag.startswith("-Xcompiler="):
                inner = flag.split("=", 1)[1].split(",")
                ok = all(_GCC_ALLOWED.match(v) and not _GCC_DENIED_F.match(v) for v in inner)
            else:
                ok = bool(_NVCC_ALLOWED.match(flag))
        elif kind == "ld":
            ok = bool(_LDFLAGS_ALLOWED.match(flag))
        if not ok:
            findings.append(f"static.cpp: {kind} flag {flag!r} is not allowed in {where}")
        i += 1
    return findings


# --- pre-build checks: what a static look can tell before any compiler runs --------------------------------
#
# A renamed ModelNew, a call of an extension function nobody binds, or `torch::sigmoid` in the extension
# used to surface only after the build and the candidate's import (30-60 s on two cores). These checks
# find them in the sources; each finding is either an error (the candidate cannot work: reported like a
# failed build) or a `torch-compute` violation, and always says it was found before the build.

CPP_SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c")
HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".cuh", ".inl", ".inc", ".hxx")
_NAMESPACE_CALL = re.compile(r"\b(?:torch|at)\s*::\s*([a-z_][a-z0-9_]*)\s*\(")
_FUNCTION_END = re.compile(
    r"\)\s*(?:const\s*|noexcept\s*|override\s*|final\s*|mutable\s*|->\s*[\w:<>,\s*&]+)*$"
)
_IDENT_BEFORE = re.compile(r"([A-Za-z_]\w*)\s*$")
_DEF_CALL = re.compile(r"\.\s*def\s*\(\s*\"(\w+)\"\s*,\s*(&?\s*[A-Za-z_][\w:]*|\[)?")
_ANY_DEF = re.compile(r"\.\s*def\s*\(")
_REGISTER = re.compile(r"\bREGISTER_BINDING\s*\(\s*([A-Za-z_]\w*)\s*,")


@dataclass
class PrecheckResult:
    """What the pre-build checks found: `errors` stop the run like a failed build, `violations` are
    `torch-compute` findings."""

    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def _strip_comments(source: str) -> str:
    """Comments removed, string literals kept (pybind11 names live in them)."""
    code, _ = strip_cpp(source.replace('"', "\x00"))
    return code.replace("\x00", '"')


def _matching(code: str, start: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at `start` (len(code) when unbalanced)."""
    depth = 0
    for i in range(start, len(code)):
        if code[i] == open_char:
            depth += 1
        elif code[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(code)


def _backward_paren(code: str, close: int) -> int:
    depth = 0
    for i in range(close, -1, -1):
        if code[i] == ")":
            depth += 1
        elif code[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def cpp_functions(code: str) -> dict[str, str]:
    """Function name -> bodies (overloads concatenated) of the top-level and member function definitions
    in comment-free C++ (a brace opened right after a parameter list's `)`)."""
    bodies: dict[str, str] = {}
    i = 0
    while True:
        i = code.find("{", i)
        if i < 0:
            return bodies
        head = code[max(0, i - 400) : i]
        match = _FUNCTION_END.search(head)
        if match is None:
            i += 1  # a namespace, class or extern "C" scope: look inside it
            continue
        close = max(0, i - 400) + match.start()
        opening = _backward_paren(code, close)
        name = _IDENT_BEFORE.search(code[max(0, opening - 200) : opening]) if opening > 0 else None
        end = _matching(code, i, "{", "}")
        if name is not None and name.group(1) not in ("if", "for", "while", "switch", "catch", "return"):
            bodies[name.group(1)] = bodies.get(name.group(1), "") + code[i:end]
            i = end
        else:
            i += 1  # a lambda or a control statement outside any function: look inside it
    return bodies


def cpp_bindings(source: str) -> dict[str, str]:
    """Python name -> the C++ code it runs: REGISTER_BINDING(name, function), REGISTER_BINDING(name,
    lambda) with `m.def("py", &fn)` inside, and plain `m.def("py", fn)` (PYBIND11_MODULE). A function is
    given by name ("=fn"); a lambda by its own text."""
    code = _strip_comments(source)
    bound: dict[str, str] = {}
    for match in _REGISTER.finditer(code):
        start = code.index("(", match.start())
        args = code[match.end() : _matching(code, start, "(", ")") - 1].strip()
        target = args.lstrip("&").strip()
        if re.fullmatch(r"[A-Za-z_][\w:]*", target):
            bound[match.group(1)] = "=" + target.split("::")[-1]
    for match in _DEF_CALL.finditer(code):
        target = match.group(2)
        if target is None:  # a target the scan cannot follow (+[]{}, a macro): its name still counts
            bound[match.group(1)] = ""
        elif target == "[":
            body_start = code.find("{", match.end())
            bound[match.group(1)] = (
                code[match.end() : _matching(code, body_start, "{", "}")] if body_start >= 0 else ""
            )
        else:
            bound[match.group(1)] = "=" + target.lstrip("&").strip().split("::")[-1]
    return bound


def bindings_named_literally(source: str) -> bool:
    """Every `.def(` names its Python function with a string literal (else the bound names are unknown:
    a macro or a variable makes them, and the missing-function check is skipped)."""
    code = _strip_comments(source)
    return len(_ANY_DEF.findall(code)) == len(_DEF_CALL.findall(code))


def forbidden_calls(code: str, compute_ops: frozenset[str]) -> list[tuple[int, str]]:
    """(offset, op) of `torch::op(` / `at::op(` calls of ops the op policy forbids (comments and strings
    do not count)."""
    stripped, _ = strip_cpp(code)
    return [(m.start(), m.group(1)) for m in _NAMESPACE_CALL.finditer(stripped) if m.group(1) in compute_ops]


def reachable_forbidden(root_code: str, functions: dict[str, str], compute_ops: frozenset[str]) -> list[str]:
    """Forbidden ops in `root_code` or in any function it names, transitively (a name mentioned is a
    name that may be called: over-approximate, never under)."""
    seen: set[str] = set()
    stack = [root_code]
    found: list[str] = []
    while stack:
        code = stack.pop()
        found += [op for _, op in forbidden_calls(code, compute_ops)]
        for ident in set(re.findall(r"[A-Za-z_]\w*", strip_cpp(code)[0])):
            if ident in functions and ident not in seen:
                seen.add(ident)
                stack.append(functions[ident])
    return sorted(set(found))


class _ExtensionUses(ast.NodeVisitor):
    """In model_new.py: the ModelNew definition, the extension modules (`import cuda_extension`, names
    assigned from load_inline/load calls) and the attributes read from them."""

    def __init__(self) -> None:
        self.model_new = False
        self.star_import = False
        self.inline_calls: list[ast.Call] = []
        self.ext_names: set[str] = set()
        self.uses: list[tuple[str, str, int]] = []  # (extension variable, attribute, line)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "ModelNew":
            self.model_new = True
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.star_import = True
            if (alias.asname or alias.name) == "ModelNew":
                self.model_new = True
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "cuda_extension":
                self.ext_names.add(alias.asname or alias.name)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == "ModelNew":
                self.model_new = True
            value = node.value
            if isinstance(value, ast.Call) and _call_name(value) in ("load_inline", "load"):
                self.inline_calls.append(value)
                if isinstance(target, ast.Name):
                    self.ext_names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    self.ext_names.add("self." + target.attr)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if isinstance(base, ast.Name):
            self.uses.append((base.id, node.attr, node.lineno))
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self":
            self.uses.append(("self." + base.attr, node.attr, node.lineno))
        self.generic_visit(node)


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _literal_strings(node: ast.AST | None) -> list[str] | None:
    """A string or a list/tuple of strings given literally; None for anything computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [str(e.value) for e in node.elts if isinstance(e, ast.Constant)]
    return None


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "..." string constants (load_inline sources usually live there)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _inline_sources(call: ast.Call, strings: dict[str, str]) -> tuple[list[str], list[str] | None] | None:
    """(C++/CUDA sources, declared `functions`) of one load_inline call when all are literal or module
    constants; None when anything is computed (the check is then skipped)."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    sources: list[str] = []
    for key in ("cpp_sources", "cuda_sources"):
        node = keywords.get(key)
        if node is None:
            continue
        items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
        for item in items:
            if isinstance(item, ast.Name) and item.id in strings:
                sources.append(strings[item.id])
            elif isinstance(item, ast.Constant) and isinstance(item.value, str):
                sources.append(item.value)
            else:
                return None
    functions_node = keywords.get("functions")
    functions = None if functions_node is None else _literal_strings(functions_node)
    if functions_node is not None and functions is None:
        return None
    return sources, functions


def precheck_candidate(root: Path, compute_ops: frozenset[str]) -> PrecheckResult:
    """Pre-build checks of a candidate directory (model_new.py, and kernels/ for a workspace)."""
    result = PrecheckResult()
    source = (root / "model_new.py").read_text(errors="replace")
    try:
        tree = ast.parse(source, filename="model_new.py")
    except SyntaxError as exc:
        result.errors.append(
            f"model_new.py does not parse: {exc.msg} at line {exc.lineno} (found before the build)"
        )
        return result
    uses = _ExtensionUses()
    uses.visit(tree)
    if not uses.model_new and not uses.star_import:
        result.errors.append("model_new.py defines no ModelNew class (found before the build)")
    bound: dict[str, str] = {}
    functions: dict[str, str] = {}
    kernels = root / "kernels"
    workspace: set[str] | None = None  # Python names the workspace binds; None: not known
    literal = True
    if kernels.is_dir():
        for path in sorted(kernels.iterdir()):
            if path.is_file() and path.suffix in CPP_SOURCE_SUFFIXES:
                text = path.read_text(errors="replace")
                functions.update(cpp_functions(_strip_comments(text)))
                if path.name.endswith("_binding.cpp"):
                    bound.update(cpp_bindings(text))
                    literal = literal and bindings_named_literally(text)
        workspace = set(bound) if bound and literal else None
    inline: set[str] | None = set()  # names the load_inline calls bind; None: some are computed
    strings = _module_strings(tree)
    for call in uses.inline_calls:
        parsed = _inline_sources(call, strings)
        if parsed is None or inline is None:
            inline = None
            continue
        sources, names = parsed
        for text in sources:
            functions.update(cpp_functions(_strip_comments(text)))
        if names is None:
            found: dict[str, str] = {}
            for text in sources:
                found.update(cpp_bindings(text))
                if not bindings_named_literally(text):
                    inline = None
            bound.update(found)
            if inline is not None:
                inline |= set(found)
        else:
            bound.update({n: "=" + n for n in names})
            inline |= set(names)
    # Attributes read from an extension module must be functions it defines.
    for variable, attr, line in uses.uses:
        if variable not in uses.ext_names or attr.startswith("__"):
            continue
        known = workspace if variable == "cuda_extension" else inline
        if known and attr not in known:
            result.errors.append(
                f"model_new.py:{line} calls {variable}.{attr}, but the extension defines no function "
                f"{attr!r} (it defines: {', '.join(sorted(known))}; found before the build)"
            )
    # Forbidden compute reachable from a function model_new.py uses.
    used = {attr for variable, attr, _ in uses.uses if variable in uses.ext_names}
    for name in sorted(used & set(bound)):
        target = bound[name]
        code = functions.get(target[1:], "") if target.startswith("=") else target
        for op in reachable_forbidden(code, functions, compute_ops):
            result.violations.append(
                f"torch-compute: aten::{op} (torch::{op} / at::{op}) reachable from the extension function "
                f"{name!r} (found before the build; PyTorch compute is not a custom kernel)"
            )
    result.violations += forward_compute(tree, compute_ops)
    result.errors = list(dict.fromkeys(result.errors))
    result.violations = list(dict.fromkeys(result.violations))
    return result


_TORCH_FUNCTION_MODULES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")


def forward_compute(tree: ast.Module, compute_ops: frozenset[str]) -> list[str]:
    """`torch.op(...)` / `F.op(...)` calls of forbidden ops written in ModelNew.forward itself (aliases
    resolved from the module's imports; tensor methods and helper functions are left to run time)."""
    aliases: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found: list[str] = []
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "ModelNew"):
            continue
        for method in cls.body:
            if not (isinstance(method, ast.FunctionDef) and method.name == "forward"):
                continue
            for call in ast.walk(method):
                if not isinstance(call, ast.Call):
                    continue
                dotted = _dotted(call.func, _Scope(aliases=aliases))
                if dotted is None or "." not in dotted:
                    continue
                module, _, name = dotted.rpartition(".")
                if module in _TORCH_FUNCTION_MODULES and name in compute_ops:
                    found.append(
                        f"torch-compute: aten::{name} ({dotted} in ModelNew.forward at model_new.py:"
                        f"{call.lineno}; found before the build; PyTorch compute is not a custom kernel)"
                    )
    return found


def screen_tree(root: Path) -> list[str]:
    """Every file of a candidate directory: Python on its AST, C/C++/CUDA on tokens."""
    local_modules = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if p.is_dir()}
    found: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".py":
            found += screen_python(path.read_text(errors="replace"), rel, local_modules)
        elif path.suffix in (*CPP_SOURCE_SUFFIXES, *HEADER_SUFFIXES):
            found += screen_cpp(path.read_text(errors="replace"), rel, root)
    return found
