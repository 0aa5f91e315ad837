from __future__ import annotations

from pathlib import Path

import pytest

from fi_profile.schema import Definition

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
#: flashinfer-bench's dataset folder, copied unchanged from the workplace's ``../shared/flashinfer-trace``
#: (its SOURCE.md says where it comes from), so that a clone alone runs the tests
FLASHINFER_TRACE = FIXTURES / "flashinfer-trace"
SHARED_FLASHINFER_TRACE = REPO.parent / "shared" / "flashinfer-trace"


@pytest.fixture(scope="session")
def flashinfer_trace() -> Path:
    assert FLASHINFER_TRACE.is_dir(), f"flashinfer-trace data expected at {FLASHINFER_TRACE}"
    return FLASHINFER_TRACE


def flashinfer_definitions() -> list[Definition]:
    # used to parametrize tests: without the data they would collect nothing and pass unseen
    assert FLASHINFER_TRACE.is_dir(), f"flashinfer-trace data expected at {FLASHINFER_TRACE}"
    return [
        Definition.model_validate_json(p.read_text())
        for p in sorted((FLASHINFER_TRACE / "definitions").glob("*/*.json"))
    ]
