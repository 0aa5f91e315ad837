"""Build the seed's typed list (``llm_request`` / ``tool_call`` entries) from the other forms.

- A conversation (seed's simple form): every assistant message is the response to the messages
  before it; each tool call it makes is followed by the ``tool`` message answering it (matched by
  ``tool_call_id``, else by order), which becomes a ``tool_call`` entry.
- An OpenAI-compatible request/response log (one JSON object per line with ``request`` and
  ``response``, as a proxy in front of a vLLM/SGLang/OpenAI server records them): each line is an
  ``llm_request``; a tool call in a response becomes a ``tool_call`` entry once a later request
  carries its result (a ``tool`` message with its id).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from fi_profile.agent_traces.openai_format import FormatError, normalize_completion, normalize_message


def tool_arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments as the object the seed asks for; text that is not a JSON object is
    kept whole under ``arguments``."""
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": raw}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _tool_entry(call: dict[str, Any], result: Any) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "tool_name": call["function"]["name"],
        "arguments": tool_arguments(call["function"].get("arguments", "")),
        "result": result if isinstance(result, str) else json.dumps(result),
    }


def _answers(calls: list[dict[str, Any]], tool_messages: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """Pair tool calls with the tool messages that answer them: by id, the rest in order."""
    by_id = {m.get("tool_call_id"): m for m in tool_messages if m.get("tool_call_id")}
    unmatched = [m for m in tool_messages if not m.get("tool_call_id") or m["tool_call_id"] not in {c["id"] for c in calls}]
    pairs = []
    for call in calls:
        answer = by_id.get(call["id"]) or (unmatched.pop(0) if unmatched else None)
        if answer is not None:
            pairs.append((call, answer))
    return pairs


def entries_from_conversation(conversation: dict[str, Any]) -> list[dict[str, Any]]:
    """The typed list for a seed conversation object (already schema-checked)."""
    model, annotation = conversation["model"], conversation.get("annotation")
    messages = [normalize_message(m, f"conversation.{i}", f"call_{i}") for i, m in enumerate(conversation["conversation"])]
    entries: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        calls = message.get("tool_calls") or []
        entry = {
            "type": "llm_request",
            "conversation": messages[:i],
            "response": {"model": model, "choices": [{"index": 0, "message": message,
                                                       "finish_reason": "tool_calls" if calls else "stop"}]},
            "model": model,
        }
        if annotation is not None:
            entry["annotation"] = annotation
        entries.append(entry)
        following = []
        for later in messages[i + 1 :]:
            if later["role"] != "tool":
                break
            following.append(later)
        entries += [_tool_entry(call, answer.get("content", "")) for call, answer in _answers(calls, following)]
    return entries


def entries_from_log(lines: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The typed list for a request/response log: ``(label, object)`` per line, in order.
    Raises :class:`FormatError` with the line's label in the path."""
    requests: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (entry, response message)
    for label, obj in lines:
        if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict) or "response" not in obj:
            raise FormatError(label, "a log line must be an object with a request object and a response")
        request = obj["request"]
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise FormatError(f"{label}: request.messages", "the chat request's messages must be a list")
        prefix = f"call_{len(requests)}"
        conversation = [normalize_message(m, f"{label}: request.messages.{i}", f"{prefix}_m{i}") for i, m in enumerate(messages)]
        response = normalize_completion(obj["response"], f"{label}: response", request.get("model"), prefix)
        model = response.get("model") or request.get("model")
        if not model:
            raise FormatError(f"{label}: response.model", "no model in the response nor in the request")
        entry: dict[str, Any] = {"type": "llm_request", "conversation": conversation, "response": response, "model": model}
        if obj.get("annotation") is not None:
            entry["annotation"] = obj["annotation"]
        requests.append((entry, response["choices"][0]["message"]))
    entries: list[dict[str, Any]] = []
    for index, (entry, message) in enumerate(requests):
        entries.append(entry)
        calls = message.get("tool_calls") or []
        if not calls:
            continue
        entries += [_tool_entry(call, result) for call, result in _results_after(requests, index, calls)]
    return entries


def _results_after(requests: list[tuple[dict, dict]], index: int, calls: list[dict[str, Any]]) -> list[tuple[dict, Any]]:
    """The tool calls of request ``index`` with their results, from the first later request that
    answers them: by id, else (a server that returned no ids, so the client made its own) the
    tool messages right after the assistant message that made the same calls, in order."""
    names = [c["function"]["name"] for c in calls]
    for entry, _ in requests[index + 1 :]:
        conversation = entry["conversation"]
        by_id = {m.get("tool_call_id"): m.get("content", "") for m in conversation if m.get("role") == "tool"}
        if any(c["id"] in by_id for c in calls):
            return [(c, by_id[c["id"]]) for c in calls if c["id"] in by_id]
        for i, message in enumerate(conversation):
            made = [c["function"]["name"] for c in message.get("tool_calls") or []]
            if message.get("role") == "assistant" and made == names:
                answers = []
                for later in conversation[i + 1 :]:
                    if later.get("role") != "tool":
                        break
                    answers.append(later.get("content", ""))
                if answers:
                    return list(zip(calls, answers))
    return []
