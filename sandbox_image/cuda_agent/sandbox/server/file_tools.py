"""The agent's file tools: read, write, edit, multi_edit, glob, grep, notebook_edit, todo_write.

They follow the agent's tool conventions (line-numbered reads, exact unique-string edits, ripgrep-like
grep output) and run in the server on the session's WorkspaceFS. Every failure is a ToolError that
becomes the tool's result text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import re2

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
from cuda_agent.sandbox.server.workspace_fs import MAX_TOOL_FILE_BYTES, ToolError, WorkspaceFS

DEFAULT_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_GLOB_RESULTS = 1000
MAX_GREP_FILE_BYTES = 8 << 20
MAX_GREP_OUTPUT_CHARS = 200_000  # a bound on what is built; the tool worker cuts the result further
RE2_MAX_MEM = 64 << 20


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
    grown = len(text) + (count if op.replace_all else 1) * (len(op.new_string) - len(op.old_string))
    if grown > MAX_TOOL_FILE_BYTES:  # checked before the new text exists, so it never costs the memory
        raise ToolError(f"the edit would make {where} {grown} characters long (limit {MAX_TOOL_FILE_BYTES})")
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


def printable(text: str) -> str:
    """`text` as valid UTF-8: file names that are not (os gives them as lone surrogates) are shown with
    U+FFFD, as ripgrep shows them, instead of failing the match or the response."""
    try:
        data = text.encode("utf-8", "surrogateescape")  # the name's own bytes back, one U+FFFD each
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")
    return data.decode("utf-8", "replace")


def compile_regex(pattern: str, what: str, *, ignore_case: bool = False, multiline: bool = False) -> Any:
    """An RE2 regex: matching is linear in the text, so no pattern can stall a tool (no backtracking,
    hence no backreferences or lookaround)."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.dot_nl = multiline
    options.max_mem = RE2_MAX_MEM
    try:
        return re2.compile(("(?m)" if multiline else "") + pattern, options)
    except re2.error as exc:
        reason = (
            exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        )
        raise ToolError(f"invalid {what}: {reason} (RE2 syntax)") from None


def glob_to_regex(pattern: str) -> Any:
    """Shell glob with `**` (any depth), `*`, `?`, `[...]` and `{a,b}` as an RE2 regex over relative paths."""
    return compile_regex(_glob_source(pattern, 0) + r"\z", f"glob {pattern[:200]!r}")


def _glob_source(pattern: str, depth: int) -> str:
    if depth > 8:
        raise ToolError(f"glob {pattern[:200]!r}: braces nested too deeply")
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
            out.append("(?:" + "|".join(_glob_source(a, depth + 1) for a in alternatives) + ")")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def glob(fs: WorkspaceFS, req: GlobInput) -> GlobResult:
    base = fs.rel(req.path or ".")
    regex = glob_to_regex(
        req.pattern.lstrip("/") if not req.pattern.startswith(str(fs.root)) else fs.rel(req.pattern)
    )
    hits = []
    for entry in fs.walk(req.path):
        rel = printable(entry.rel)
        sub = rel if base == "." else rel[len(base) + 1 :]
        if regex.match(sub) or regex.match(rel):
            hits.append(entry)
    hits.sort(key=lambda e: e.mtime, reverse=True)  # most recently changed first
    files = [printable(fs.display(e.rel)) for e in hits[:MAX_GLOB_RESULTS]]
    note = f"\n[... {len(hits) - MAX_GLOB_RESULTS} more]" if len(hits) > MAX_GLOB_RESULTS else ""
    return GlobResult(output="\n".join(files) + note if files else "No files found", files=files)


def grep(fs: WorkspaceFS, req: GrepInput) -> GrepResult:
    """ripgrep-like search. Output stops growing at MAX_GREP_OUTPUT_CHARS (the scan stops there too, so
    `matches` is then a lower bound); files_with_matches reads each file only up to its first hit."""
    regex = compile_regex(
        req.pattern, f"regex {req.pattern[:200]!r}", ignore_case=req.case_insensitive, multiline=req.multiline
    )
    name_filter = glob_to_regex(req.glob) if req.glob else None
    before = req.before if req.before is not None else (req.context or 0)
    after = req.after if req.after is not None else (req.context or 0)
    lines_out: list[str] = []
    budget = MAX_GREP_OUTPUT_CHARS
    total = 0
    for entry in fs.walk(req.path):
        if budget <= 0:
            lines_out.append(f"[... output cut at {MAX_GREP_OUTPUT_CHARS} characters; narrow the search]")
            break
        rel_name = printable(entry.rel)
        if name_filter and not (
            name_filter.match(rel_name.rsplit("/", 1)[-1]) or name_filter.match(rel_name)
        ):
            continue
        if entry.size > MAX_GREP_FILE_BYTES:
            continue
        try:
            rel, text = _text(fs, entry.rel)
        except ToolError:
            continue  # binary, vanished or foreign files are skipped, as ripgrep does
        shown = printable(fs.display(rel))
        hits = _matching_lines(regex, text, req.multiline)
        if req.output_mode == "files_with_matches":
            found = next(hits, None) is not None
            new, count = ([shown], 1) if found else ([], 0)
        elif req.output_mode == "count":
            count = sum(1 for _ in hits)
            new = [f"{shown}:{count}"] if count else []
        else:
            lines = text.splitlines()
            chosen = _within_budget(hits, lines, len(shown) + 12, budget)
            count = len(chosen)
            new = _content_lines(shown, lines, chosen, before, after, req.line_numbers)
        total += count
        lines_out.extend(new)
        budget -= sum(len(line) + 1 for line in new)
    if req.head_limit is not None and len(lines_out) > req.head_limit:
        lines_out = [*lines_out[: req.head_limit], f"[... output limited to {req.head_limit} entries]"]
    if not lines_out:
        return GrepResult(output="No matches found", matches=0)
    return GrepResult(output="\n".join(lines_out), matches=total)


def _within_budget(hits: Iterator[int], lines: list[str], prefix: int, budget: int) -> list[int]:
    """The hits whose lines fit in `budget` characters; stops the (lazy) scan there."""
    chosen = []
    for n in hits:
        chosen.append(n)
        budget -= prefix + min(len(lines[n]), MAX_LINE_CHARS)
        if budget <= 0:
            break
    return chosen


def _matching_lines(regex: Any, text: str, multiline: bool) -> Iterator[int]:
    """0-based numbers of the lines that hold (the start of) a match, in order, computed lazily."""
    if not multiline:
        return (n for n, line in enumerate(text.splitlines()) if regex.search(line))
    return _multiline_hits(regex, text.encode())


def _multiline_hits(regex: Any, data: bytes) -> Iterator[int]:
    # Byte offsets (no offset translation); newlines counted incrementally, each line reported once.
    line, counted_to, last = 0, 0, -1
    for m in regex.finditer(data):
        line += data.count(b"\n", counted_to, m.start())
        counted_to = m.start()
        if line != last:
            last = line
            yield line


def filter_lines(pattern: str, text: str) -> str:
    """bash_output's filter: the lines of `text` that match `pattern`."""
    regex = compile_regex(pattern, f"filter regex {pattern[:200]!r}")
    return "".join(line for line in text.splitlines(keepends=True) if regex.search(line))


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
# A session's todo list is kept in the server's memory and echoed back whole: both stay small.
MAX_TODOS = 100
MAX_TODO_CHARS = 1000


def todo_write(todos: list[TodoItem], req: TodoWriteInput) -> TodoWriteResult:
    """Replaces the session's list (kept by the caller in `todos`); a list past the bounds is refused."""
    if len(req.todos) > MAX_TODOS:
        raise ToolError(f"{len(req.todos)} todos: at most {MAX_TODOS} per list")
    for i, todo in enumerate(req.todos):
        longest = max(len(todo.content), len(todo.active_form or ""), len(todo.id or ""))
        if longest > MAX_TODO_CHARS:
            raise ToolError(f"todo {i + 1} is {longest} characters long: at most {MAX_TODO_CHARS}")
    todos[:] = req.todos
    lines = [f"{_TODO_MARK[t.status]} {t.content}" for t in todos]
    return TodoWriteResult(
        output="Todos updated:\n" + "\n".join(lines) if lines else "Todo list cleared", todos=list(todos)
    )
