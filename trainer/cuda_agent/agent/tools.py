"""The agent's tools as the policy sees them (the names CUDA Agent's paper uses) and as the sandbox runs
them (the server's routes). The schemas come from the sandbox contract (`cuda_agent.api.sandbox`), so the
tool list has one home; this module only renames.

| policy (paper) | sandbox server |
|---|---|
| Bash | bash |
| BashOutput | bash_output |
| KillBash | kill_bash |
| Read | read |
| Write | write |
| Edit | edit |
| MultiEdit | multi_edit |
| Glob | glob |
| Grep | grep |
| NotebookEdit | notebook_edit |
| TodoWrite | todo_write |
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from cuda_agent.api.sandbox import TOOL_SPECS, ToolName

POLICY_TOOL_NAMES: dict[str, ToolName] = {
    "Bash": ToolName.BASH,
    "BashOutput": ToolName.BASH_OUTPUT,
    "KillBash": ToolName.KILL_BASH,
    "Read": ToolName.READ,
    "Write": ToolName.WRITE,
    "Edit": ToolName.EDIT,
    "MultiEdit": ToolName.MULTI_EDIT,
    "Glob": ToolName.GLOB,
    "Grep": ToolName.GREP,
    "NotebookEdit": ToolName.NOTEBOOK_EDIT,
    "TodoWrite": ToolName.TODO_WRITE,
}
if set(POLICY_TOOL_NAMES.values()) != set(ToolName):  # a tool added to the contract must be named here
    raise ImportError(f"policy tool names miss {sorted(set(ToolName) - set(POLICY_TOOL_NAMES.values()))}")


class ToolArgumentError(ValueError):
    """A call whose arguments do not fit the tool's input model; the message is the policy's observation."""


SERVER_TO_POLICY: dict[ToolName, str] = {tool: name for name, tool in POLICY_TOOL_NAMES.items()}


def openai_tools(enabled: Iterable[ToolName]) -> list[dict[str, Any]]:
    """OpenAI function-calling schemas of the enabled tools under their policy names, in the table's order."""
    wanted = set(enabled)
    schemas = []
    for name, tool in POLICY_TOOL_NAMES.items():
        if tool in wanted:
            schema = TOOL_SPECS[tool].openai_schema()
            schema["function"]["name"] = name
            schemas.append(schema)
    return schemas


def resolve(name: str, enabled: Iterable[ToolName]) -> ToolName | None:
    """The sandbox tool a policy name stands for; server names are accepted too (models trained on other
    prompts use them). None when the name is unknown or not enabled for this run."""
    tool = POLICY_TOOL_NAMES.get(name)
    if tool is None and name in TOOL_SPECS:
        tool = ToolName(name)
    return tool if tool in set(enabled) else None


def validate_arguments(tool: ToolName, arguments: dict[str, Any]) -> BaseModel:
    """The tool's input model, or ToolArgumentError naming each bad field."""
    try:
        return TOOL_SPECS[tool].input_model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
        )
        raise ToolArgumentError(f"invalid arguments: {problems}") from None
