"""Shared fixtures: every async test runs under the anyio plugin, on asyncio and on trio.

The backends are chosen here, by one fixture. An async test that cannot run on trio
says why with ``@pytest.mark.asyncio_only("reason")`` (on the test, on one of its
``pytest.param`` values, or in a module's ``pytestmark``); its trio items are then
deselected. Modules that need other backend options (uvloop, trio's ``MockClock``)
parametrize ``anyio_backend`` themselves.
"""

from __future__ import annotations

import pytest

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]


def pytest_configure(config: pytest.Config) -> None:
    # Registered here, next to the hook that gives it its meaning.
    config.addinivalue_line(
        "markers",
        "asyncio_only(reason): an async test that cannot run on trio, and why; "
        "its trio items are deselected (tests/conftest.py)",
    )


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """asyncio and trio for every async test, unless it is marked ``asyncio_only``."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("asyncio_only")
        if marker is None:
            kept.append(item)
            continue
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{item.nodeid}: asyncio_only needs a reason (why not trio)")
        (dropped if _backend(item) == "trio" else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _backend(item: pytest.Item) -> str | None:
    """The anyio backend an item runs on, if it is parametrized with one."""
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("anyio_backend") if callspec is not None else None
    return backend[0] if isinstance(backend, tuple) else backend
