"""Normalise OpenAI-compatible chat messages and completions to the OpenAI form the seed names.

vLLM's and SGLang's OpenAI-compatible servers accept and return messages that differ from
OpenAI's in small ways; each rule below is one such difference:

- content given as a list of parts (``[{"type": "text", "text": ...}]``): the text parts joined;
  other parts (images, audio) as ``[image_url]``-style placeholders;
- ``role: "developer"`` (OpenAI's newer name for system): ``system``;
- an assistant message with ``content: null`` and no tool calls (vLLM, when only reasoning came
  back): empty content;
- ``tool_calls: []`` (vLLM on plain answers): no tool calls;
- a tool call without ``type`` (SGLang) or ``id``: ``function`` and a generated id; arguments given
  as an object rather than a JSON string: serialised; the streaming ``index`` kept as it is;
- the legacy ``function_call``: one tool call;
- reasoning as ``reasoning`` (vLLM ≥ 0.10) or ``reasoning_content`` (vLLM before, SGLang): kept as
  ``reasoning_content``;
- a completion without ``model`` or a choice without ``index``: taken from the request / position.

Unknown fields are kept: the schema's OpenAI models are open.
"""

from __future__ import annotations

import json
from typing import Any


class FormatError(ValueError):
    """A message or completion that cannot be read even leniently; ``path`` names the field."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}")


def _text(content: Any, path: str) -> Any:
    if not isinstance(content, list):
        return content
    pieces = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            pieces.append(str(part.get("text", "")))
        elif isinstance(part, dict) and "type" in part:
            pieces.append(f"[{part['type']}]")
        else:
            raise FormatError(f"{path}.{i}", "a content part must be a string or an object with a type")
    return "\n".join(pieces)


def normalize_tool_call(call: Any, path: str, fallback_id: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise FormatError(path, "a tool call must be an object with a function object")
    function = dict(call["function"])
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        function["arguments"] = json.dumps(arguments)
    return {**call, "id": call.get("id") or fallback_id, "type": call.get("type") or "function", "function": function}


def normalize_message(message: Any, path: str, id_prefix: str = "call") -> dict[str, Any]:
    if not isinstance(message, dict):
        raise FormatError(path, "a message must be an object")
    out = dict(message)
    if out.get("role") == "developer":
        out["role"] = "system"
    if "content" in out:
        out["content"] = _text(out["content"], f"{path}.content")
    if out.get("function_call") and not out.get("tool_calls"):
        out["tool_calls"] = [{"id": f"{id_prefix}_0", "type": "function", "function": out.pop("function_call")}]
    calls = out.get("tool_calls")
    if calls == [] or calls is None:
        out.pop("tool_calls", None)
    elif isinstance(calls, list):
        out["tool_calls"] = [
            normalize_tool_call(c, f"{path}.tool_calls.{i}", f"{id_prefix}_{i}") for i, c in enumerate(calls)
        ]
    if out.get("role") == "assistant" and out.get("content") is None and not out.get("tool_calls"):
        out["content"] = ""
    if "reasoning" in out and "reasoning_content" not in out:
        out["reasoning_content"] = out.pop("reasoning")
    if out.get("reasoning_content") is None:
        out.pop("reasoning_content", None)
    out.pop("reasoning", None)
    return out


def normalize_completion(response: Any, path: str, model: str | None, id_prefix: str) -> dict[str, Any]:
    if not isinstance(response, dict):
        raise FormatError(path, "a chat completion must be an object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise FormatError(f"{path}.choices", "a chat completion needs at least one choice")
    normalized = []
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise FormatError(f"{path}.choices.{i}", "a choice must be an object")
        message = {"role": "assistant", **(choice.get("message") or {})}
        normalized.append(
            {**choice, "index": choice.get("index", i),
             "message": normalize_message(message, f"{path}.choices.{i}.message", f"{id_prefix}_c{i}")}
        )
    out = {**response, "choices": normalized}
    if not out.get("model") and model:
        out["model"] = model
    return out
