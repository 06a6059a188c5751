"""Tool calls out of a policy's reply: Hermes / Qwen-style `<tool_call>{json}</tool_call>` blocks in the
generated text, or OpenAI-style `tool_calls` from a chat API. Nothing here raises on bad model output:
a call that cannot be used becomes a `CallError`, which the loop turns into an observation and counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)

CallErrorKind = Literal["malformed", "truncated", "unknown_tool", "invalid_arguments"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None


@dataclass(frozen=True)
class CallError:
    kind: CallErrorKind
    message: str
    name: str | None = None
    call_id: str | None = None


ParsedCall = ToolCall | CallError


def _arguments(raw: Any) -> dict[str, Any] | str:
    """Arguments as a dict; models emit an object or a JSON string of one. A str return is the problem."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw, strict=False) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            return f"arguments are not valid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(raw, dict):
        return f"arguments must be a JSON object, got {type(raw).__name__}"
    return raw


def _call_from_object(obj: Any, call_id: str | None = None) -> ParsedCall:
    if not isinstance(obj, dict):
        return CallError("malformed", f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError("malformed", 'a tool call needs a "name" string', call_id=call_id)
    args = _arguments(obj.get("arguments", obj.get("parameters")))
    if isinstance(args, str):
        return CallError("malformed", f"tool {name}: {args}", name=name, call_id=call_id)
    return ToolCall(name=name, arguments=args, call_id=call_id)


def parse_hermes(text: str) -> list[ParsedCall]:
    """Every `<tool_call>` block in order; an opened block that never closes is a truncated call."""
    calls: list[ParsedCall] = []
    end = 0
    for match in _BLOCK.finditer(text):
        end = match.end()
        body = match.group(1).strip()
        try:
            obj = json.loads(body, strict=False)
        except json.JSONDecodeError as exc:
            calls.append(CallError("malformed", f"tool call is not valid JSON ({exc.msg} at char {exc.pos})"))
            continue
        calls.append(_call_from_object(obj))
    if TOOL_CALL_OPEN in text[end:]:
        calls.append(
            CallError("truncated", f"the reply ended inside a {TOOL_CALL_OPEN} block (no {TOOL_CALL_CLOSE})")
        )
    return calls


def parse_openai(tool_calls: list[dict[str, Any]]) -> list[ParsedCall]:
    """OpenAI chat `message.tool_calls`: `{"id", "type": "function", "function": {"name", "arguments"}}`."""
    calls: list[ParsedCall] = []
    for raw in tool_calls:
        call_id = raw.get("id") if isinstance(raw, dict) else None
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict):
            calls.append(CallError("malformed", 'a tool call needs a "function" object', call_id=call_id))
            continue
        calls.append(_call_from_object(function, call_id))
    return calls
