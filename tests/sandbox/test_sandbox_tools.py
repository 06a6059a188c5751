"""Contract tests of every agent tool, bad input included: errors come back as readable results."""

from __future__ import annotations

import json
import time

import pytest
from sandbox_helpers import RunningServer, needs_root

from cuda_agent.sandbox.server.models import ToolResult

pytestmark = needs_root()


def call(server: RunningServer, sid: str, tool: str, **args: object) -> ToolResult:
    return server.client.tool(sid, tool, args)


def test_bash_reports_output_exit_code_and_merges_stderr(server: RunningServer, session_id: str) -> None:
    ok = call(server, session_id, "bash", command="echo out; echo err >&2; pwd")
    assert not ok.is_error and ok.exit_code == 0  # type: ignore[attr-defined]
    assert ok.output.splitlines()[:2] == ["out", "err"] and ok.output.rstrip().endswith("/workspace")
    failed = call(server, session_id, "bash", command="exit 3")
    assert failed.is_error and failed.exit_code == 3  # type: ignore[attr-defined]


def test_bash_timeout_kills_the_command(server: RunningServer, session_id: str) -> None:
    result = call(server, session_id, "bash", command="echo started; sleep 30; echo never", timeout=500)
    assert result.is_error and result.timed_out and result.exit_code is None  # type: ignore[attr-defined]
    assert "started" in result.output and "never" not in result.output
    assert "timed out after 0.5 s" in result.output


def test_bash_output_is_truncated_in_the_middle_with_a_note(server: RunningServer, session_id: str) -> None:
    result = call(
        server,
        session_id,
        "bash",
        command="echo FIRST; head -c 200000 /dev/zero | tr '\\0' x; echo; echo LAST",
    )
    assert result.truncated  # type: ignore[attr-defined]
    assert result.output.startswith("FIRST") and result.output.rstrip().endswith("LAST")
    assert "bytes of output truncated" in result.output and len(result.output) < 31000


def test_background_jobs_stream_output_and_can_be_killed(server: RunningServer, session_id: str) -> None:
    started = call(
        server,
        session_id,
        "bash",
        command="for i in 1 2 3; do echo tick $i; sleep 0.2; done; echo done",
        run_in_background=True,
    )
    bash_id = started.bash_id  # type: ignore[attr-defined]
    assert bash_id and "Started background job" in started.output
    collected = ""
    for _ in range(100):
        out = call(server, session_id, "bash_output", bash_id=bash_id)
        collected += out.output + "\n"
        if out.status == "exited":  # type: ignore[attr-defined]
            break
        time.sleep(0.1)
    assert [line for line in collected.splitlines() if line.startswith("tick")] == [
        "tick 1",
        "tick 2",
        "tick 3",
    ]
    assert "[status: exited, exit code 0]" in collected
    sleeper = call(server, session_id, "bash", command="echo a; echo b; sleep 60", run_in_background=True)
    sid = sleeper.bash_id  # type: ignore[attr-defined]
    time.sleep(0.3)
    filtered = call(server, session_id, "bash_output", bash_id=sid, filter="^b")
    assert filtered.output.startswith("b\n") and "a\n" not in filtered.output
    killed = call(server, session_id, "kill_bash", shell_id=sid)
    assert "Killed background job" in killed.output
    assert call(server, session_id, "bash_output", bash_id=sid).status == "killed"  # type: ignore[attr-defined]
    unknown = call(server, session_id, "bash_output", bash_id="bash_nope")
    assert unknown.is_error and "no background job 'bash_nope'" in unknown.output
    bad_filter = call(server, session_id, "bash_output", bash_id=sid, filter="(")
    assert bad_filter.is_error and "invalid filter regex" in bad_filter.output


def test_read_numbers_lines_and_selects_ranges(server: RunningServer, session_id: str) -> None:
    call(
        server,
        session_id,
        "write",
        file_path="lines.txt",
        content="".join(f"line {i}\n" for i in range(1, 11)),
    )
    full = call(server, session_id, "read", file_path="lines.txt")
    assert full.output.splitlines()[0] == "     1\tline 1" and full.total_lines == 10  # type: ignore[attr-defined]
    part = call(server, session_id, "read", file_path="lines.txt", offset=4, limit=2)
    assert part.output.splitlines()[:2] == ["     4\tline 4", "     5\tline 5"]
    assert "read on with offset=6" in part.output
    workspace = server.client.get_session(session_id).workspace
    absolute = call(server, session_id, "read", file_path=f"{workspace}/lines.txt", offset=10)
    assert absolute.output.startswith("    10\tline 10")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing.py", "file not found"),
        ("../../../../etc/passwd", "outside the workspace"),
        ("/etc/passwd", "outside the workspace"),
        ("kernels", "is a directory"),
    ],
)
def test_read_errors_are_results(server: RunningServer, session_id: str, path: str, message: str) -> None:
    result = call(server, session_id, "read", file_path=path)
    assert result.is_error and message in result.output


def test_file_tools_never_follow_symlinks_out_of_the_workspace(
    server: RunningServer, session_id: str
) -> None:
    call(server, session_id, "bash", command="ln -s /etc/shadow shadow; ln -s / rootdir")
    read = call(server, session_id, "read", file_path="shadow")
    assert read.is_error and "symlink" in read.output
    write = call(server, session_id, "write", file_path="rootdir/tmp/planted-by-agent", content="x")
    assert write.is_error and "symlink" in write.output
    grep = call(server, session_id, "grep", pattern="root", output_mode="files_with_matches")
    assert "shadow" not in grep.output


def test_write_creates_directories_owned_by_the_session_user(server: RunningServer, session_id: str) -> None:
    result = call(server, session_id, "write", file_path="a/b/c.txt", content="hello\n")
    assert not result.is_error and "Created" in result.output
    owners = call(server, session_id, "bash", command="stat -c '%u %n' a a/b a/b/c.txt; id -u")
    lines = owners.output.split()
    assert lines[0] == lines[2] == lines[4] == lines[-1]
    again = call(server, session_id, "write", file_path="a/b/c.txt", content="bye\n")
    assert "Updated" in again.output
    assert call(server, session_id, "bash", command="cat a/b/c.txt").output == "bye\n"


def test_edit_replaces_a_unique_string_or_explains_why_not(server: RunningServer, session_id: str) -> None:
    call(server, session_id, "write", file_path="k.cpp", content="int a = 1;\nint b = 1;\nint c = 2;\n")
    unique = call(
        server, session_id, "edit", file_path="k.cpp", old_string="int c = 2;", new_string="int c = 3;"
    )
    assert not unique.is_error and unique.replacements == 1  # type: ignore[attr-defined]
    ambiguous = call(server, session_id, "edit", file_path="k.cpp", old_string="= 1;", new_string="= 9;")
    assert ambiguous.is_error and "matches 2 places" in ambiguous.output
    every = call(
        server, session_id, "edit", file_path="k.cpp", old_string="= 1;", new_string="= 9;", replace_all=True
    )
    assert every.replacements == 2  # type: ignore[attr-defined]
    missing = call(server, session_id, "edit", file_path="k.cpp", old_string="nope", new_string="x")
    assert missing.is_error and "was not found" in missing.output
    same = call(server, session_id, "edit", file_path="k.cpp", old_string="int", new_string="int")
    assert same.is_error and "identical" in same.output
    assert call(server, session_id, "read", file_path="k.cpp").output.count("= 9;") == 2


def test_multi_edit_applies_all_or_nothing(server: RunningServer, session_id: str) -> None:
    call(server, session_id, "write", file_path="m.py", content="x = 1\ny = 2\n")
    failed = call(
        server,
        session_id,
        "multi_edit",
        file_path="m.py",
        edits=[
            {"old_string": "x = 1", "new_string": "x = 10"},
            {"old_string": "z = 3", "new_string": "z = 30"},
        ],
    )
    assert failed.is_error and "edit 2 of 2 failed, no edit was applied" in failed.output
    assert call(server, session_id, "bash", command="cat m.py").output == "x = 1\ny = 2\n"
    done = call(
        server,
        session_id,
        "multi_edit",
        file_path="m.py",
        edits=[
            {"old_string": "x = 1", "new_string": "x = 10"},
            {"old_string": "x = 10\ny", "new_string": "x = 10\nw"},
        ],
    )
    assert not done.is_error and done.replacements == 2  # type: ignore[attr-defined]
    assert call(server, session_id, "bash", command="cat m.py").output == "x = 10\nw = 2\n"


def test_glob_matches_at_any_depth_newest_first(server: RunningServer, session_id: str) -> None:
    call(server, session_id, "write", file_path="kernels/old_binding.cpp", content="//\n")
    call(server, session_id, "bash", command="sleep 0.05; mkdir -p kernels/sub; echo > kernels/sub/new.cu")
    result = call(server, session_id, "glob", pattern="**/*.{cu,cpp}")
    names = [f.rsplit("/", 1)[1] for f in result.files]  # type: ignore[attr-defined]
    assert names[0] == "new.cu" and "old_binding.cpp" in names and "binding.cpp" in names
    scoped = call(server, session_id, "glob", pattern="*.cu", path="kernels/sub")
    assert [f.rsplit("/", 1)[1] for f in scoped.files] == ["new.cu"]  # type: ignore[attr-defined]
    assert call(server, session_id, "glob", pattern="*.nothing").output == "No files found"


def test_grep_modes_context_and_bad_regex(server: RunningServer, session_id: str) -> None:
    call(server, session_id, "write", file_path="src/a.cu", content="alpha\n__global__ void k() {}\nomega\n")
    call(server, session_id, "write", file_path="src/b.py", content="__global__ = 1\n")
    files = call(server, session_id, "grep", pattern=r"__global__\s+void")
    assert files.output.endswith("src/a.cu") and "b.py" not in files.output
    content = call(
        server,
        session_id,
        "grep",
        pattern="GLOBAL",
        output_mode="content",
        **{"-i": True, "-C": 1},
        glob="*.cu",
    )
    lines = content.output.splitlines()
    assert [line.split("a.cu", 1)[1] for line in lines] == [
        "-1-alpha",
        ":2:__global__ void k() {}",
        "-3-omega",
    ]
    counted = call(server, session_id, "grep", pattern="__global__", output_mode="count", path="src")
    assert sorted(line.rsplit(":", 1)[1] for line in counted.output.splitlines()) == ["1", "1"]
    bad = call(server, session_id, "grep", pattern="([unclosed")
    assert bad.is_error and "invalid regex" in bad.output
    outside = call(server, session_id, "grep", pattern="x", path="/etc")
    assert outside.is_error and "outside the workspace" in outside.output


def test_notebook_edit_replaces_inserts_and_deletes_cells(server: RunningServer, session_id: str) -> None:
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "id": "c1",
                "metadata": {},
                "source": ["print(1)"],
                "outputs": [],
                "execution_count": 1,
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    call(server, session_id, "write", file_path="nb.ipynb", content=json.dumps(notebook))
    call(server, session_id, "notebook_edit", notebook_path="nb.ipynb", cell_id="c1", new_source="print(2)\n")
    call(
        server,
        session_id,
        "notebook_edit",
        notebook_path="nb.ipynb",
        cell_id="c1",
        new_source="# Notes",
        cell_type="markdown",
        edit_mode="insert",
    )
    cells = json.loads(call(server, session_id, "bash", command="cat nb.ipynb").output)["cells"]
    assert [c["cell_type"] for c in cells] == ["code", "markdown"] and cells[0]["source"] == ["print(2)\n"]
    call(server, session_id, "notebook_edit", notebook_path="nb.ipynb", cell_id="c1", edit_mode="delete")
    cells = json.loads(call(server, session_id, "bash", command="cat nb.ipynb").output)["cells"]
    assert [c["cell_type"] for c in cells] == ["markdown"]
    missing = call(server, session_id, "notebook_edit", notebook_path="nb.ipynb", cell_id="zz", new_source="")
    assert missing.is_error and "no cell with id 'zz'" in missing.output
    not_nb = call(server, session_id, "notebook_edit", notebook_path="model.py", cell_id="c1", new_source="")
    assert not_nb.is_error and "is not a Jupyter notebook" in not_nb.output


def test_todo_write_keeps_the_session_list(server: RunningServer, session_id: str) -> None:
    result = call(
        server,
        session_id,
        "todo_write",
        todos=[
            {"content": "write kernel", "status": "completed", "activeForm": "Writing kernel"},
            {"content": "profile", "status": "in_progress"},
        ],
    )
    assert result.output == "Todos updated:\n[x] write kernel\n[~] profile"
    status, raw = server.client.request(
        "POST",
        f"/v1/sessions/{session_id}/tools/todo_write",
        b'{"todos": [{"content": "x", "status": "doing"}]}',
    )
    assert status == 422 and "todos.0.status" in json.loads(raw)["error"]


def test_invalid_tool_input_is_422_naming_the_field(server: RunningServer, session_id: str) -> None:
    status, raw = server.client.request(
        "POST", f"/v1/sessions/{session_id}/tools/edit", b'{"file_path": "x"}'
    )
    assert status == 422 and "old_string" in json.loads(raw)["error"]
    status, raw = server.client.request(
        "POST", f"/v1/sessions/{session_id}/tools/bash", b'{"command": "true", "x": 1}'
    )
    assert status == 422 and json.loads(raw)["detail"][0]["loc"] == "x"
