"""Chat-template handling without re-tokenization: the prompt is tokenized once, and every later
observation is tokenized as the *delta* the chat template appends after the policy's turn, so the ids of
earlier text are never produced twice (token-in-token-out, as verl does it).

The delta is found by rendering a fixed conversation that ends with a placeholder assistant turn, once
alone and once followed by the tool messages and the next generation prompt: what the second render adds
after the placeholder's content (its end-of-turn marker, the tool messages' wrapping, the assistant
header) is tokenized on its own. When the policy's last token already was that end-of-turn marker it is
not repeated.
"""

from __future__ import annotations

import json
from typing import Any

_PLACEHOLDER = "\x00cuda-agent-placeholder\x00"
_BASE: list[dict[str, Any]] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _PLACEHOLDER},
]
# End-of-turn tokens of common chat templates: a turn ends on any of these that the vocabulary has.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def hermes_tools_block(tools: list[dict[str, Any]]) -> str:
    """The tool preamble Qwen2.5 / Hermes templates render, for templates that ignore `tools`."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


class ChatCodec:
    """A Hugging Face tokenizer's chat template, turned into token ids for the agent loop."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools
        probe = [{"role": "user", "content": "u"}]
        # Templates that never mention `tools` get the Hermes preamble in the system message instead.
        self.template_renders_tools = self._render(probe, tools=tools) != self._render(probe)
        self.tool_role = self._tool_role()
        vocab = tokenizer.get_vocab()
        stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        stops |= {vocab[t] for t in _END_OF_TURN if t in vocab}
        self.stop_token_ids = frozenset(stops)

    def _render(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, gen: bool = False
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=gen
        )
        return str(text)

    def _tool_role(self) -> str:
        try:
            self._render([*_BASE, {"role": "tool", "content": "x"}], gen=True)
            return "tool"
        except Exception:  # templates that only know system/user/assistant raise on other roles
            return "user"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        # Special tokens stay in the text: tool-call markers may be special tokens (Qwen's <tool_call>).
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """The first prompt: system message (the skill), user message (the task), generation prompt."""
        if not self.template_renders_tools:
            system += hermes_tools_block(self.tools)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        tools = self.tools if self.template_renders_tools else None
        return self.encode(self._render(messages, tools=tools, gen=True))

    def tool_message(
        self, content: str, name: str | None = None, call_id: str | None = None
    ) -> dict[str, Any]:
        if self.tool_role == "user":
            return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
        message: dict[str, Any] = {"role": "tool", "content": content}
        if name is not None:
            message["name"] = name
        if call_id is not None:
            message["tool_call_id"] = call_id
        return message

    def observation_ids(self, messages: list[dict[str, Any]], last_token: int | None) -> list[int]:
        """Ids that follow the policy's turn: its end-of-turn marker (unless `last_token` was it), the
        messages as the template wraps them, and the next assistant header."""
        base = self._render(_BASE)
        full = self._render([*_BASE, *messages], gen=True)
        cut = base.index(_PLACEHOLDER) + len(_PLACEHOLDER)
        if full[:cut] != base[:cut]:
            raise ValueError("the chat template renders earlier turns differently once more follow")
        ids = self.encode(full[cut:])
        if ids and last_token is not None and ids[0] == last_token and last_token in self.stop_token_ids:
            ids = ids[1:]
        return ids
