"""Decontamination: how close a synthesized task is to any task of a benchmark set, by AST.

The measure (docs/data.md, "Decontamination"):
1. Take the computation of the task: the bodies of `Model.__init__` (without `super().__init__()`) and
   `Model.forward`; a file without a `Model` class contributes all its top-level code except imports and
   docstrings. The boilerplate every KernelBench file shares (class header, get_inputs, scale switches)
   is left out, otherwise any two one-op tasks would look alike.
2. Turn it into a pre-order sequence of tokens: the AST node type of every node, with
   - names of local variables and arguments replaced by their order of first appearance (`v0`, `v1`...),
     and `self.<attr>` by `self.a0`, `self.a1`... (renaming a variable or a layer changes nothing),
   - module aliases (`torch`, `nn`, `F`, `math`, `np`) replaced by `mod` (`torch.relu` = `F.relu`),
   - API attribute names kept (`relu`, `Conv2d`, `sum`: the operators are what makes two tasks the same),
   - numbers, and names standing for sizes (parameters of `__init__`, module-level constants), replaced
     by `num` (passing a size in or writing it as a literal changes nothing); other constants by their
     type; keyword names kept.
3. Similarity = difflib's SequenceMatcher ratio of the two sequences (2 * matches / total length), in
   [0, 1]. A sample is dropped when its similarity to any benchmark task exceeds the threshold (0.9).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable
from dataclasses import dataclass

_MODULE_ALIASES = {"torch", "nn", "F", "math", "np", "numpy", "functional"}


class _Tokenizer(ast.NodeVisitor):
    def __init__(self, sizes: set[str]) -> None:
        self.sizes = sizes
        self.tokens: list[str] = []
        self._names: dict[str, str] = {}
        self._attrs: dict[str, str] = {}

    def generic_visit(self, node: ast.AST) -> None:
        if not isinstance(node, ast.expr_context | ast.Load | ast.Store):
            self.tokens.append(type(node).__name__)
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _MODULE_ALIASES:
            self.tokens.append("mod")
        elif node.id in self.sizes:
            self.tokens.append("num")
        else:
            self.tokens.append(self._names.setdefault(node.id, f"v{len(self._names)}"))

    def visit_arg(self, node: ast.arg) -> None:
        self.tokens.append(self._names.setdefault(node.arg, f"v{len(self._names)}"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.tokens.append("self." + self._attrs.setdefault(node.attr, f"a{len(self._attrs)}"))
            return
        self.tokens.append(f"Attribute:{node.attr}")
        self.visit(node.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        number = isinstance(node.value, int | float) and not isinstance(node.value, bool)
        self.tokens.append("num" if number else f"Constant:{type(node.value).__name__}")

    def visit_keyword(self, node: ast.keyword) -> None:
        self.tokens.append(f"kw:{node.arg}")
        self.visit(node.value)


def _is_super_init(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "__init__"
    )


def is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _computation(tree: ast.Module) -> tuple[list[ast.stmt], set[str]]:
    """The statements that compute, and the names that stand for sizes."""
    sizes = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            body: list[ast.stmt] = []
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in ("__init__", "forward"):
                    body += [s for s in item.body if not _is_super_init(s) and not is_docstring(s)]
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    sizes |= {arg.arg for arg in item.args.args[1:] + item.args.kwonlyargs}
            return body, sizes
    top = [s for s in tree.body if not isinstance(s, ast.Import | ast.ImportFrom) and not is_docstring(s)]
    return top, set()


def signature_tokens(code: str) -> list[str]:
    """The token sequence of a task's computation (see the module docstring). Raises SyntaxError."""
    body, sizes = _computation(ast.parse(code))
    tokenizer = _Tokenizer(sizes)
    for stmt in body:
        tokenizer.visit(stmt)
    return tokenizer.tokens


def similarity(a: list[str], b: list[str]) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@dataclass(frozen=True)
class Match:
    task: str
    similarity: float


class BenchmarkIndex:
    """Token sequences of a benchmark set, for `closest(code)`."""

    def __init__(self, tasks: Iterable[tuple[str, str]]) -> None:
        """`tasks`: (name, source) pairs; a file that does not parse is an error naming it."""
        self.tasks: list[tuple[str, list[str]]] = []
        for name, code in tasks:
            try:
                self.tasks.append((name, signature_tokens(code)))
            except SyntaxError as exc:
                raise ValueError(
                    f"benchmark task {name} does not parse: line {exc.lineno}: {exc.msg}"
                ) from exc

    def __len__(self) -> int:
        return len(self.tasks)

    def closest(self, code: str, above: float = 0.0) -> Match | None:
        """The most similar benchmark task, or None when none beats `above`. The quick upper bounds of
        SequenceMatcher skip most pairs without the quadratic comparison."""
        tokens = signature_tokens(code)
        best: Match | None = None
        for name, bench in self.tasks:
            floor = best.similarity if best else above
            matcher = difflib.SequenceMatcher(None, tokens, bench, autojunk=False)
            if matcher.real_quick_ratio() <= floor or matcher.quick_ratio() <= floor:
                continue
            score = matcher.ratio()
            if score > floor:
                best = Match(name, score)
        return best
