"""Reading TrainingRun / SandboxPool objects from YAML or dicts, with errors that point at the field.

`kubectl apply` gets its errors from the apiserver; a local run reads the same YAML here. Each problem is
reported as `FILE:LINE: spec.algorithm.clipLow: MESSAGE` so it can be fixed without reading a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import yaml
from pydantic import ValidationError

from cuda_agent.api.base import API_VERSION, CustomResource
from cuda_agent.api.sandboxpool import SandboxPool
from cuda_agent.api.trainingrun import TrainingRun

Resource = TrainingRun | SandboxPool
RESOURCE_KINDS: dict[str, type[TrainingRun] | type[SandboxPool]] = {
    "TrainingRun": TrainingRun,
    "SandboxPool": SandboxPool,
}
R = TypeVar("R", bound=CustomResource)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a document: where (dotted field path, YAML line when known) and what."""

    path: str
    message: str
    line: int | None = None

    def render(self, source: str | None) -> str:
        where = source or ("line" if self.line is not None else "")
        if self.line is not None:
            where += f":{self.line}" if source else f" {self.line}"
        field = f"{self.path}: " if self.path else ""
        return f"{where}: {field}{self.message}" if where else f"{field}{self.message}"


class ResourceError(ValueError):
    """A document is not a valid TrainingRun or SandboxPool; `problems` lists every violation found."""

    def __init__(self, problems: Sequence[Problem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("\n".join(p.render(source) for p in self.problems))


@overload
def load_resource(
    source: str | Mapping[str, Any], kind: None = None, *, source_name: str | None = None
) -> Resource: ...
@overload
def load_resource(source: str | Mapping[str, Any], kind: type[R], *, source_name: str | None = None) -> R: ...
def load_resource(
    source: str | Mapping[str, Any],
    kind: type[CustomResource] | None = None,
    *,
    source_name: str | None = None,
) -> CustomResource:
    """Validate one object given as YAML text or an already-parsed mapping.

    With `kind` (TrainingRun or SandboxPool) any other kind is an error; without it the document's own
    `kind` picks the model. `source_name` (a file name) prefixes every error message.
    """
    if isinstance(source, str):
        documents = _parse_yaml(source, source_name)
        if len(documents) != 1:
            raise ResourceError(
                [Problem("", f"expected one YAML document, found {len(documents)}")], source_name
            )
        data, node = documents[0]
    else:
        data, node = source, None
    return _validate(data, node, kind, source_name)


def load_resources(text: str, *, source_name: str | None = None) -> list[Resource]:
    """Validate every document of a multi-document YAML stream (empty documents are skipped)."""
    return [_validate(data, node, None, source_name) for data, node in _parse_yaml(text, source_name)]


def load_resource_file(path: Path) -> list[Resource]:
    """`load_resources` on a file; messages start with the file's path."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ResourceError([Problem("", f"cannot read: {error.strerror}")], str(path)) from error
    return load_resources(text, source_name=str(path))


def _parse_yaml(text: str, source_name: str | None) -> list[tuple[Any, yaml.Node]]:
    # Parsed twice: once to plain data, once to nodes that remember their line for error messages.
    try:
        values = list(yaml.safe_load_all(text))
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(error, "problem", None) or str(error)
        raise ResourceError([Problem("", f"invalid YAML: {problem}", line)], source_name) from error
    return [(value, node) for value, node in zip(values, nodes, strict=True) if value is not None]


def _validate(
    data: Any, node: yaml.Node | None, kind: type[CustomResource] | None, source_name: str | None
) -> Resource:
    if not isinstance(data, Mapping):
        raise ResourceError(
            [Problem("", f"expected a mapping, got {type(data).__name__}", _line(node, ()))], source_name
        )
    api_version, kind_name = data.get("apiVersion"), data.get("kind")
    if api_version != API_VERSION:
        raise ResourceError(
            [
                Problem(
                    "apiVersion",
                    f"expected {API_VERSION!r}, got {api_version!r}",
                    _line(node, ("apiVersion",)),
                )
            ],
            source_name,
        )
    model = RESOURCE_KINDS.get(kind_name) if isinstance(kind_name, str) else None
    expected = [kind.__name__] if kind is not None else sorted(RESOURCE_KINDS)
    if model is None or (kind is not None and model is not kind):
        raise ResourceError(
            [Problem("kind", f"expected {' or '.join(expected)}, got {kind_name!r}", _line(node, ("kind",)))],
            source_name,
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = [
            Problem(_dotted(err["loc"]), _describe(err), _line(node, err["loc"])) for err in error.errors()
        ]
        raise ResourceError(problems, source_name) from None


def _dotted(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _describe(err: Mapping[str, Any]) -> str:
    message = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] not in ("missing", "extra_forbidden") and isinstance(value, str | int | float | bool):
        message += f" (got {value!r})"
    return message


def _line(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest entry along `loc`: the line of its key for a mapping entry, so a
    nested section points at `algorithm:` rather than its first child; the parent's line when missing."""
    if node is None:
        return None
    line = node.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            entry = next(((key, value) for key, value in node.value if key.value == part), None)
            if entry is None:
                break
            line, node = entry[0].start_mark.line, entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1
