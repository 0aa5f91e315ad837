"""A family's source files, and constants set in them as data.

A source declares its constants as plain assignments at its top (``EPS = 1e-6``); a Solution made
from it gets each replaced by the value the Definition gives. The assignments are found in the
parsed source, never by a pattern on its text: a constant the source does not declare is an error
naming the source, not a silent no-op.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Mapping

from fi_profile.schema.reference import replace_nodes, top_level_assignments


@functools.lru_cache(maxsize=None)
def read_source(package: str, file: str) -> str:
    """A file of a family's package (read once per process: the package's files do not change)."""
    return (resources.files(package) / file).read_text()


def set_constants(source: str, values: Mapping[str, str], label: str) -> str:
    """``source`` with the value of each top-level ``NAME = ...`` of ``values`` replaced by the
    literal given; raises ``KeyError`` naming ``label`` where one is not declared."""
    if not values:
        return source
    declared = top_level_assignments(source)
    missing = [name for name in values if name not in declared]
    if missing:
        raise KeyError(f"{label} declares no constant {', '.join(missing)} (a top-level NAME = value)")
    return replace_nodes(source, [(declared[name].value, value) for name, value in values.items()])
