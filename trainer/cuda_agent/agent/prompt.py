"""The policy's first two messages: the workspace's SKILL.md (an Agent Skills file the sandbox renders per
device) as the system message, and the task with its `model.py` as the user message."""

from __future__ import annotations

from typing import Any

import yaml


def split_skill(text: str) -> tuple[dict[str, Any], str]:
    """(front matter, body) of an Agent Skills file; a file without front matter is all body."""
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("SKILL.md: front matter opened with '---' is never closed")
    meta = yaml.safe_load(text[4:end]) or {}
    if not isinstance(meta, dict):
        raise ValueError("SKILL.md: front matter must be a YAML mapping")
    return meta, text[end + 5 :].lstrip("\n")


def system_message(skill: str) -> str:
    meta, body = split_skill(skill)
    header = (
        f"Skill `{meta['name']}`: {meta['description']}\n\n"
        if "name" in meta and "description" in meta
        else ""
    )
    return header + body


def task_message(task_name: str, model_source: str) -> str:
    return (
        f"Task `{task_name}`. The workspace's `model.py` is:\n\n```python\n{model_source.rstrip()}\n```\n\n"
        "Write `ModelNew` as SKILL.md describes, check it with `verify` and `profile`, and stop calling "
        "tools when you are done: the workspace is then judged once more and that result is your reward."
    )
