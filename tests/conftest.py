"""Shared fixtures: every async test runs under the anyio plugin, on asyncio and on trio.

The backends are chosen here, by one fixture. An async test that cannot run on trio
says why with ``@pytest.mark.asyncio_only("reason")`` (on the test, on one of its
``pytest.param`` values, or in a module's ``pytestmark``); its trio items are then
deselected (they count in pytest's "deselected" total). ``trio_only("reason")`` is the
mirror image, for a test about trio. ``slow_on_trio("reason")`` keeps a long
real-server test's asyncio items in the README's test command and moves its trio
items to CI's slow stage (they are marked ``slow``), where they still run.
Modules that need other backend options (uvloop, trio's ``MockClock``) parametrize
``anyio_backend`` themselves.
"""

from __future__ import annotations

import pytest

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]
#: marker -> the one backend a test so marked runs on
ONLY = {"asyncio_only": "asyncio", "trio_only": "trio"}


def pytest_configure(config: pytest.Config) -> None:
    # Registered here, next to the hook that gives them their meaning.
    for marker, backend in ONLY.items():
        config.addinivalue_line(
            "markers",
            f"{marker}(reason): an async test that runs on {backend} alone, and why; "
            "its other backend's items are deselected (tests/conftest.py)",
        )
    config.addinivalue_line(
        "markers",
        "slow_on_trio(reason): its trio items are marked slow, for CI's slow stage "
        "(tests/conftest.py)",
    )


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """asyncio and trio for every async test, unless marked ``asyncio_only``/``trio_only``."""
    return str(request.param)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("slow_on_trio")
        if marker is not None and _backend(item) == "trio":
            if not (marker.args or marker.kwargs.get("reason")):
                raise pytest.UsageError(f"{item.nodeid}: slow_on_trio needs a reason")
            item.add_marker(pytest.mark.slow)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        allowed, backend = _allowed(item), _backend(item)
        elsewhere = bool(allowed) and backend is not None and backend not in allowed
        (dropped if elsewhere else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _allowed(item: pytest.Item) -> set[str]:
    """The backends an item's markers allow (empty: any); each marker must say why."""
    allowed = set()
    for name, backend in ONLY.items():
        marker = item.get_closest_marker(name)
        if marker is None:
            continue
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{item.nodeid}: {name} needs a reason")
        allowed.add(backend)
    return allowed


def _backend(item: pytest.Item) -> str | None:
    """The anyio backend an item runs on, if it is parametrized with one."""
    callspec = getattr(item, "callspec", None)
    backend: object = callspec.params.get("anyio_backend") if callspec is not None else None
    if isinstance(backend, tuple):  # (name, options)
        backend = backend[0]
    return backend if isinstance(backend, str) else None
