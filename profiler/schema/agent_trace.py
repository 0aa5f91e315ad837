"""Agent Trace (seed 001): what a kernel-writing agent said and did.

Two forms: a single conversation object (``model``, ``annotation``, ``conversation``), and a list
of typed entries in order: ``llm_request`` (the conversation sent and the OpenAI-style response),
``tool_call`` (name, arguments, result, captured output) and ``mcp`` (schema still open upstream,
so any further fields are kept).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, RootModel, model_validator

from fi_profile.schema.base import OpenModel, StrictModel

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(OpenModel):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(OpenModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(OpenModel):
    role: Role
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None

    @model_validator(mode="after")
    def _content_present(self) -> "Message":
        # OpenAI allows a null content only on an assistant message that calls tools.
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only for an assistant message with tool_calls)")
        return self


class Choice(OpenModel):
    index: int = 0
    message: Message
    finish_reason: Optional[str] = None


class ChatCompletion(OpenModel):
    model: str
    choices: list[Choice] = Field(min_length=1)


class AgentConversation(StrictModel):
    model: str = Field(min_length=1)
    annotation: Optional[str] = None
    conversation: list[Message]


class LLMRequestEntry(StrictModel):
    type: Literal["llm_request"]
    conversation: list[Message]
    response: ChatCompletion
    model: str = Field(min_length=1)
    annotation: Optional[str] = None


class ToolCallEntry(StrictModel):
    type: Literal["tool_call"]
    tool_name: str = Field(min_length=1)
    arguments: dict[str, Any]
    result: str
    cli_output: Optional[str] = None


class MCPEntry(OpenModel):
    type: Literal["mcp"]


AgentTraceEntry = Annotated[Union[LLMRequestEntry, ToolCallEntry, MCPEntry], Field(discriminator="type")]


class AgentTrace(RootModel[list[AgentTraceEntry]]):
    """The typed list form."""
