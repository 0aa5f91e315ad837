"""The Definitions shipped in the top-level ``definitions`` package."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Optional

from fi_profile.schema.definition import Definition


def shipped_definitions_dir() -> Path:
    return Path(str(resources.files("fi_profile.definitions")))


@lru_cache(maxsize=1)
def shipped_definitions() -> dict[str, Definition]:
    """Every shipped Definition by name (validated on load: a broken file is a packaging bug)."""
    found: dict[str, Definition] = {}
    root = resources.files("fi_profile.definitions")
    for op_dir in sorted(root.iterdir(), key=lambda p: p.name):
        if not op_dir.is_dir() or op_dir.name.startswith(("_", ".")):
            continue
        for entry in sorted(op_dir.iterdir(), key=lambda p: p.name):
            if entry.name.endswith(".json"):
                definition = Definition.model_validate_json(entry.read_text())
                found[definition.name] = definition
    return found


def shipped_definition(name: str) -> Optional[Definition]:
    return shipped_definitions().get(name)
