"""Shared pydantic configuration: unknown fields are errors, so a typo never passes silently."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class OpenModel(BaseModel):
    """For formats owned by others (OpenAI messages): keep fields we do not model."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
