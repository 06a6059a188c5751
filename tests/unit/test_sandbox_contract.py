"""The sandbox contract (`cuda_agent.api.sandbox`) is the one home of the tool list and the API bodies:
the client loads no server module, and the server's tools, the TrainingRun's tool enum and the function
schemas an agent loop hands to a model all come from it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from cuda_agent.api import AgentTool, TrainingRun
from cuda_agent.api.sandbox import TOOL_SPECS, ToolName


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(__import__('json').dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_client_loads_no_server_module_and_neither_aiohttp_nor_torch_until_used() -> None:
    loaded = _loaded_after("import cuda_agent.sandbox.client")
    assert [m for m in loaded if m.startswith("cuda_agent.sandbox.server")] == []
    assert "torch" not in loaded and "aiohttp" not in loaded


def test_the_contract_needs_only_pydantic() -> None:
    loaded = _loaded_after("import cuda_agent.api.sandbox")
    assert {m for m in loaded if m.startswith("cuda_agent")} == {
        "cuda_agent",
        "cuda_agent.api",
        "cuda_agent.api.sandbox",
        # the judge's shared types (pydantic only): its options, device, and the verdict's reward scale
        "cuda_agent.api.judge",
    }
    assert not {"torch", "aiohttp", "kopf", "ray", "re2"} & set(loaded)


def test_server_tools_are_the_contract_specs_plus_implementations() -> None:
    from cuda_agent.sandbox.server.tools import TOOLS

    assert list(TOOLS) == list(TOOL_SPECS)
    for name, tool in TOOLS.items():
        assert tool.spec is TOOL_SPECS[name]


def test_trainingrun_tools_are_the_contract_tools() -> None:
    assert AgentTool is ToolName
    assert set(AgentTool) == set(TOOL_SPECS)
    run = TrainingRun.model_validate(
        {
            "metadata": {"name": "r"},
            "spec": {
                "model": {"base": "s3://bucket/model"},
                "dataset": {"uri": "s3://bucket/tasks"},
                "sandboxPoolRef": {"name": "p"},
            },
        }
    )
    assert [str(t) for t in run.spec.agent.tools] == list(TOOL_SPECS)


def _walk(node: Any) -> Any:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


@pytest.mark.parametrize("name", list(TOOL_SPECS))
def test_openai_function_schema_is_self_contained(name: str) -> None:
    schema = TOOL_SPECS[name].openai_schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == name and fn["description"] == TOOL_SPECS[name].description
    params = fn["parameters"]
    assert params["type"] == "object"
    assert set(params.get("required", [])) <= set(params["properties"])
    for node in _walk(params):
        if isinstance(node, dict):
            assert "$ref" not in node and "$defs" not in node
    json.dumps(schema)  # plain JSON, as a chat template receives it


def test_openai_schema_uses_the_agents_argument_names_and_inlines_nested_models() -> None:
    grep = TOOL_SPECS["grep"].openai_schema()["function"]["parameters"]["properties"]
    assert {"-i", "-n", "-A", "-B", "-C"} <= set(grep)
    assert grep["path"]["type"] == "string"  # `str | None = None` reads as an optional string
    assert "anyOf" not in grep["path"] and "default" not in grep["path"]
    kill = TOOL_SPECS["kill_bash"].openai_schema()["function"]["parameters"]
    assert kill["required"] == ["shell_id"]
    edits = TOOL_SPECS["multi_edit"].openai_schema()["function"]["parameters"]["properties"]["edits"]
    assert edits["items"]["required"] == ["old_string", "new_string"]
    todo = TOOL_SPECS["todo_write"].openai_schema()["function"]["parameters"]["properties"]["todos"]
    assert "activeForm" in todo["items"]["properties"]
    # What the schema names is what the input model accepts.
    TOOL_SPECS["kill_bash"].input_model.model_validate({"shell_id": "bash_1"})
    TOOL_SPECS["grep"].input_model.model_validate({"pattern": "x", "-i": True, "-C": 2})
