"""Tool-call parsing and the tool table, without a server."""

from __future__ import annotations

import json

from cuda_agent.agent.loop import truncate_observation
from cuda_agent.agent.parsing import CallError, ToolCall, parse_hermes, parse_openai
from cuda_agent.agent.prompt import split_skill
from cuda_agent.agent.tools import POLICY_TOOL_NAMES, openai_tools, resolve, validate_arguments
from cuda_agent.api.sandbox import TOOL_SPECS, ToolName


def test_hermes_blocks_in_order_with_string_or_object_arguments() -> None:
    text = (
        'thinking...\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "model.py"}}\n'
        '</tool_call>\n<tool_call>{"name": "Bash", "arguments": "{\\"command\\": \\"ls\\"}"}'
        "</tool_call>"
    )
    assert parse_hermes(text) == [
        ToolCall("Read", {"file_path": "model.py"}),
        ToolCall("Bash", {"command": "ls"}),
    ]
    # Raw newlines inside JSON strings (common in generated code) are accepted.
    code = (
        '<tool_call>{"name": "Write", "arguments": {"file_path": "a.py", "content": "x = 1\ny = 2\n"}}'
        "</tool_call>"
    )
    (write,) = parse_hermes(code)
    assert isinstance(write, ToolCall) and write.arguments["content"] == "x = 1\ny = 2\n"


def test_bad_hermes_calls_are_errors_not_exceptions() -> None:
    kinds = [
        c.kind
        for c in parse_hermes(
            "<tool_call>{nope</tool_call><tool_call>[1]</tool_call>"
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "Bash", "arguments": 3}</tool_call>'
            '<tool_call>{"name": "Bash", "arg'
        )
        if isinstance(c, CallError)
    ]
    assert kinds == ["malformed", "malformed", "malformed", "malformed", "truncated"]
    assert parse_hermes("no calls here") == []


def test_openai_tool_calls() -> None:
    calls = parse_openai(
        [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "Glob", "arguments": '{"pattern": "*.py"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "Bash", "arguments": "{bad"}},
            {"id": "c3"},
        ]
    )
    assert calls[0] == ToolCall("Glob", {"pattern": "*.py"}, "c1")
    assert isinstance(calls[1], CallError) and calls[1].kind == "malformed" and calls[1].call_id == "c2"
    assert isinstance(calls[2], CallError) and calls[2].kind == "malformed"


def test_policy_tools_cover_the_contract_with_openai_schemas() -> None:
    schemas = openai_tools(list(ToolName))
    assert [s["function"]["name"] for s in schemas] == list(POLICY_TOOL_NAMES)
    assert len(schemas) == len(TOOL_SPECS) == 11
    edit = next(s for s in schemas if s["function"]["name"] == "Edit")
    assert edit["type"] == "function" and edit["function"]["parameters"]["required"] == [
        "file_path",
        "old_string",
        "new_string",
    ]
    assert "$defs" not in json.dumps(schemas)  # chat templates cannot resolve refs
    assert openai_tools([ToolName.BASH])[0]["function"]["name"] == "Bash"


def test_resolve_accepts_policy_and_server_names_of_enabled_tools_only() -> None:
    enabled = [ToolName.BASH, ToolName.READ]
    assert resolve("Bash", enabled) is ToolName.BASH and resolve("read", enabled) is ToolName.READ
    assert resolve("Write", enabled) is None and resolve("Compile", enabled) is None
    assert validate_arguments(ToolName.GREP, {"pattern": "x", "-i": True}).model_dump()["case_insensitive"]


def test_truncation_keeps_head_and_tail() -> None:
    text = "A" * 1000 + "B" * 1000
    cut = truncate_observation(text, 300)
    assert cut.startswith("A" * 200) and cut.endswith("B" * 100) and "1700 characters cut" in cut
    assert truncate_observation("short", 300) == "short"


def test_skill_front_matter() -> None:
    meta, body = split_skill("---\nname: k\ndescription: d e\n---\n\n# Body\n")
    assert meta == {"name": "k", "description": "d e"} and body == "# Body\n"
    assert split_skill("# no front matter") == ({}, "# no front matter")
