"""Shared fixtures: every async test runs under the anyio plugin."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """asyncio by default; modules that also run under trio override this fixture."""
    return "asyncio"
