"""The agent's file tools: read, write, edit, multi_edit, glob, grep, notebook_edit, todo_write.

They follow the agent's tool conventions (line-numbered reads, exact unique-string edits, ripgrep-like
grep output) and run in the server on the session's WorkspaceFS. Every failure is a ToolError that
becomes the tool's result text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from cuda_agent.sandbox.server.models import (
    EditInput,
    EditOperation,
    EditResult,
    GlobInput,
    GlobResult,
    GrepInput,
    GrepResult,
    MultiEditInput,
    NotebookEditInput,
    ReadInput,
    ReadResult,
    TodoItem,
    TodoWriteInput,
    TodoWriteResult,
    ToolResult,
    WriteInput,
)
from cuda_agent.sandbox.server.workspace_fs import ToolError, WorkspaceFS

DEFAULT_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_GLOB_RESULTS = 1000
MAX_GREP_FILE_BYTES = 8 << 20


def _text(fs: WorkspaceFS, file_path: str) -> tuple[str, str]:
    rel, data = fs.read_bytes(file_path)
    if b"\x00" in data[:8192]:
        raise ToolError(f"{fs.display(rel)} is a binary file ({len(data)} bytes); not shown")
    return rel, data.decode("utf-8", "replace")


def read(fs: WorkspaceFS, req: ReadInput) -> ReadResult:
    rel, text = _text(fs, req.file_path)
    lines = text.splitlines()
    if not lines:
        return ReadResult(output=f"{fs.display(rel)} exists and is empty", total_lines=0)
    first = (req.offset or 1) - 1
    if first >= len(lines):
        raise ToolError(f"offset {req.offset} is past the end of {fs.display(rel)} ({len(lines)} lines)")
    chosen = lines[first : first + (req.limit or DEFAULT_READ_LINES)]
    out = []
    for number, line in enumerate(chosen, start=first + 1):
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" [... line cut at {MAX_LINE_CHARS} characters]"
        out.append(f"{number:6d}\t{line}")
    shown_to = first + len(chosen)
    if shown_to < len(lines):
        out.append(f"[... {len(lines) - shown_to} more lines; read on with offset={shown_to + 1}]")
    return ReadResult(output="\n".join(out), total_lines=len(lines))


def write(fs: WorkspaceFS, req: WriteInput) -> ToolResult:
    existed = fs.exists(req.file_path)
    rel = fs.write_bytes(req.file_path, req.content.encode())
    verb = "Updated" if existed else "Created"
    return ToolResult(output=f"{verb} {fs.display(rel)} ({len(req.content.encode())} bytes)")


def _apply(text: str, op: EditOperation, where: str) -> tuple[str, int]:
    if op.old_string == op.new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    if not op.old_string:
        raise ToolError("old_string is empty; use the write tool to create or overwrite a file")
    count = text.count(op.old_string)
    if count == 0:
        raise ToolError(f"old_string was not found in {where}")
    if count > 1 and not op.replace_all:
        raise ToolError(
            f"old_string matches {count} places in {where}; add surrounding context to make it unique, "
            "or set replace_all to change every occurrence"
        )
    if op.replace_all:
        return text.replace(op.old_string, op.new_string), count
    return text.replace(op.old_string, op.new_string, 1), 1


def edit(fs: WorkspaceFS, req: EditInput) -> EditResult:
    rel, text = _text(fs, req.file_path)
    op = EditOperation(old_string=req.old_string, new_string=req.new_string, replace_all=req.replace_all)
    new_text, count = _apply(text, op, fs.display(rel))
    fs.write_bytes(req.file_path, new_text.encode())
    return EditResult(output=f"Edited {fs.display(rel)}: {count} replacement(s)", replacements=count)


def multi_edit(fs: WorkspaceFS, req: MultiEditInput) -> EditResult:
    """All edits apply in order to the in-memory text; the file is written only if every one succeeds."""
    rel, text = _text(fs, req.file_path)
    total = 0
    for index, op in enumerate(req.edits, start=1):
        try:
            text, count = _apply(text, op, fs.display(rel))
        except ToolError as exc:
            raise ToolError(f"edit {index} of {len(req.edits)} failed, no edit was applied: {exc}") from None
        total += count
    fs.write_bytes(req.file_path, text.encode())
    return EditResult(
        output=f"Applied {len(req.edits)} edits to {fs.display(rel)}: {total} replacement(s)",
        replacements=total,
    )


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Shell glob with `**` (any depth), `*`, `?`, `[...]` and `{a,b}` as a regex over relative paths."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ToolError(f"glob {pattern!r}: unclosed '['")
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        elif c == "{":
            end = pattern.find("}", i + 1)
            if end < 0:
                raise ToolError(f"glob {pattern!r}: unclosed '{{'")
            alternatives = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(glob_to_regex(a).pattern[:-2] for a in alternatives) + ")")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob(fs: WorkspaceFS, req: GlobInput) -> GlobResult:
    base = fs.rel(req.path or ".")
    regex = glob_to_regex(
        req.pattern.lstrip("/") if not req.pattern.startswith(str(fs.root)) else fs.rel(req.pattern)
    )
    hits = []
    for entry in fs.walk(req.path):
        sub = entry.rel if base == "." else entry.rel[len(base) + 1 :]
        if regex.match(sub) or regex.match(entry.rel):
            hits.append(entry)
    hits.sort(key=lambda e: e.mtime, reverse=True)  # most recently changed first
    files = [fs.display(e.rel) for e in hits[:MAX_GLOB_RESULTS]]
    note = f"\n[... {len(hits) - MAX_GLOB_RESULTS} more]" if len(hits) > MAX_GLOB_RESULTS else ""
    return GlobResult(output="\n".join(files) + note if files else "No files found", files=files)


def grep(fs: WorkspaceFS, req: GrepInput) -> GrepResult:
    flags = (re.IGNORECASE if req.case_insensitive else 0) | (
        re.MULTILINE | re.DOTALL if req.multiline else 0
    )
    try:
        regex = re.compile(req.pattern, flags)
    except re.error as exc:
        raise ToolError(f"invalid regex {req.pattern!r}: {exc}") from None
    name_filter = glob_to_regex(req.glob) if req.glob else None
    before = req.before if req.before is not None else (req.context or 0)
    after = req.after if req.after is not None else (req.context or 0)
    lines_out: list[str] = []
    matched_files = 0
    total = 0
    for entry in fs.walk(req.path):
        if name_filter and not (
            name_filter.match(entry.rel.rsplit("/", 1)[-1]) or name_filter.match(entry.rel)
        ):
            continue
        if entry.size > MAX_GREP_FILE_BYTES:
            continue
        try:
            rel, text = _text(fs, entry.rel)
        except ToolError:
            continue  # binary, vanished or foreign files are skipped, as ripgrep does
        hit_lines = _matching_lines(regex, text, req.multiline)
        if not hit_lines:
            continue
        matched_files += 1
        total += len(hit_lines)
        shown = fs.display(rel)
        if req.output_mode == "files_with_matches":
            lines_out.append(shown)
        elif req.output_mode == "count":
            lines_out.append(f"{shown}:{len(hit_lines)}")
        else:
            lines_out.extend(
                _content_lines(shown, text.splitlines(), hit_lines, before, after, req.line_numbers)
            )
    if req.head_limit is not None and len(lines_out) > req.head_limit:
        lines_out = [*lines_out[: req.head_limit], f"[... output limited to {req.head_limit} entries]"]
    if not lines_out:
        return GrepResult(output="No matches found", matches=0)
    return GrepResult(output="\n".join(lines_out), matches=total)


def _matching_lines(regex: re.Pattern[str], text: str, multiline: bool) -> list[int]:
    """0-based numbers of the lines that hold (the start of) a match."""
    if not multiline:
        return [n for n, line in enumerate(text.splitlines()) if regex.search(line)]
    starts = sorted({text.count("\n", 0, m.start()) for m in regex.finditer(text)})
    return starts


def _content_lines(
    shown: str, lines: list[str], hits: list[int], before: int, after: int, numbers: bool
) -> list[str]:
    out: list[str] = []
    hit_set = set(hits)
    last_printed = -2
    for h in hits:
        lo, hi = max(0, h - before), min(len(lines) - 1, h + after)
        if last_printed >= 0 and lo > last_printed + 1 and (before or after):
            out.append("--")
        for n in range(max(lo, last_printed + 1), hi + 1):
            sep = ":" if n in hit_set else "-"
            prefix = f"{shown}{sep}{n + 1}{sep}" if numbers else f"{shown}{sep}"
            out.append(prefix + lines[n][:MAX_LINE_CHARS])
            last_printed = n
    return out


def notebook_edit(fs: WorkspaceFS, req: NotebookEditInput) -> ToolResult:
    rel, text = _text(fs, req.notebook_path)
    try:
        notebook: dict[str, Any] = json.loads(text)
        cells: list[dict[str, Any]] = notebook["cells"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolError(f"{fs.display(rel)} is not a Jupyter notebook: {exc}") from None
    index = _cell_index(cells, req.cell_id) if req.cell_id is not None else None
    source = req.new_source.splitlines(keepends=True)
    if req.edit_mode == "insert":
        if req.cell_type is None:
            raise ToolError("cell_type is required to insert a cell")
        cell: dict[str, Any] = {
            "cell_type": req.cell_type,
            "id": uuid.uuid4().hex[:8],
            "metadata": {},
            "source": source,
        }
        if req.cell_type == "code":
            cell.update(outputs=[], execution_count=None)
        position = 0 if index is None else index + 1
        cells.insert(position, cell)
        done = f"Inserted cell {cell['id']} at position {position}"
    elif index is None:
        raise ToolError(f"cell_id is required to {req.edit_mode} a cell")
    elif req.edit_mode == "delete":
        removed = cells.pop(index)
        done = f"Deleted cell {removed.get('id', index)}"
    else:
        cell = cells[index]
        cell["source"] = source
        if req.cell_type is not None and req.cell_type != cell.get("cell_type"):
            cell["cell_type"] = req.cell_type
            if req.cell_type == "code":
                cell.setdefault("outputs", [])
                cell.setdefault("execution_count", None)
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
        elif cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None  # stale outputs would mislead
        done = f"Replaced cell {cell.get('id', index)}"
    fs.write_bytes(req.notebook_path, (json.dumps(notebook, indent=1) + "\n").encode())
    return ToolResult(output=f"{done} in {fs.display(rel)}")


def _cell_index(cells: list[dict[str, Any]], cell_id: str) -> int:
    for i, cell in enumerate(cells):
        if cell.get("id") == cell_id:
            return i
    number = cell_id.removeprefix("cell-")
    if number.isdigit() and int(number) < len(cells):
        return int(number)
    raise ToolError(f"no cell with id {cell_id!r} (the notebook has {len(cells)} cells)")


_TODO_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


def todo_write(todos: list[TodoItem], req: TodoWriteInput) -> TodoWriteResult:
    """Replaces the session's list (kept by the caller in `todos`)."""
    todos[:] = req.todos
    lines = [f"{_TODO_MARK[t.status]} {t.content}" for t in todos]
    return TodoWriteResult(
        output="Todos updated:\n" + "\n".join(lines) if lines else "Todo list cleared", todos=list(todos)
    )
