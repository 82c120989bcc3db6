"""``tenant=``: who a call is for (issue #23, its first part). Checked like
``priority`` at the call; sent as OpenAI's ``user`` unless the call has its own; on
every call, map item, view and the SyncClient; tenants take turns within a tier.
Against a real simulator process, which counts running sequences per ``user``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import llmbatch
from llmbatch import InvalidRequestError, InvalidTypeError
from llmbatch_server.testing import SimulatorProcess, run_simulator

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with run_simulator("--speed", "100", "--max-num-seqs", "64") as server:
        yield server


@pytest.mark.parametrize(
    ("tenant", "error"),
    [
        (7, InvalidTypeError),
        ("", InvalidRequestError),
        ("two\nlines", InvalidRequestError),
        ("x" * 257, InvalidRequestError),
    ],
)
async def test_a_bad_tenant_fails_the_call_alone(
    sim: SimulatorProcess, tenant: Any, error: type[Exception]
) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        with pytest.raises(error) as info:
            await client.complete("hi", tenant=tenant, max_tokens=2)
        assert info.value.field == "tenant"  # type: ignore[attr-defined]
        with pytest.raises(error):
            client.with_options(tenant=tenant)
        with pytest.raises(error):  # at the call, not once per item
            await client.map(["a", "b"], tenant=tenant, max_tokens=2)
        # Nothing else is affected: the next call answers.
        assert (await client.complete("hi", tenant="ok", max_tokens=2)).text


async def test_the_tenant_is_sent_as_user(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        await client.complete("hi", tenant="agent-7", max_tokens=2)
        await client.chat([{"role": "user", "content": "hi"}], tenant="agent-8", max_tokens=2)
        # A call's own user wins: the tenant still groups it.
        await client.complete("hi", tenant="agent-9", user="person-1", max_tokens=2)
        async for _ in client.stream("hi", tenant="agent-10", max_tokens=2):
            pass
        view = client.with_options(tenant="agent-11")
        await view.complete("hi", max_tokens=2)
        await view.complete("hi", tenant="agent-12", max_tokens=2)  # the call's wins
    for user in ("agent-7", "agent-8", "person-1", "agent-10", "agent-11", "agent-12"):
        assert sim.peak_running(user=user) == 1, user
    assert sim.peak_running(user="agent-9") == 0


async def test_maps_take_a_tenant_and_items_their_own(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url) as client:
        items: list[Any] = [{"prompt": f"p{i}", "tenant": "item-tenant"} for i in range(3)]
        results = await client.map([*items, "plain"], tenant="map-tenant", max_tokens=2)
    assert all(r.ok for r in results)
    assert sim.peak_running(user="item-tenant") >= 1
    assert sim.peak_running(user="map-tenant") == 1


def test_the_sync_client_takes_a_tenant(sim: SimulatorProcess) -> None:
    with llmbatch.SyncClient(sim.base_url) as client:
        client.complete("hi", tenant="sync-1", max_tokens=2)
        client.with_options(tenant="sync-2").complete("hi", max_tokens=2)
        assert all(r.ok for r in client.map(["a"], tenant="sync-3", max_tokens=2))
    for user in ("sync-1", "sync-2", "sync-3"):
        assert sim.peak_running(user=user) == 1, user


async def test_one_tenants_backlog_does_not_hold_anothers(sim: SimulatorProcess) -> None:
    # A queues 4,000 calls at once; B maps 100 prompts, same tier and parameters,
    # once A has answers. Without tenants B's requests would queue behind all of A's
    # in one group; as tenants their groups take turns, so B is done before A is
    # half done.
    answered = 0
    a_half = anyio.Event()
    a_running = anyio.Event()
    b_done = 0.0
    a_half_at = 0.0

    async def one_of_a(i: int) -> None:
        nonlocal answered, a_half_at
        await client.complete(f"A {i}", tenant="A", priority="batch", max_tokens=8)
        answered += 1
        a_running.set()
        if answered == 2_000:
            a_half_at = time.monotonic()
            a_half.set()

    async def run_b() -> None:
        nonlocal b_done
        await a_running.wait()
        prompts = [f"B {i}" for i in range(100)]
        results = await client.map(prompts, tenant="B", max_tokens=8)
        assert all(r.ok for r in results)
        b_done = time.monotonic()

    async with llmbatch.Client(sim.base_url) as client, anyio.create_task_group() as tg:
        for i in range(4_000):
            tg.start_soon(one_of_a, i)
        tg.start_soon(run_b)
    assert a_half.is_set()
    assert b_done < a_half_at


# -- limits (TenantLimits) -------------------------------------------------------------


async def test_max_in_flight_holds_at_the_server_beside_an_unlimited_tenant() -> None:
    """Counted by the server: a tenant with ``max_in_flight=4`` never has more than 4
    prompts running there, while a tenant without limits fills the rest."""
    with run_simulator("--speed", "20", "--max-num-seqs", "64") as server:
        tenants = {"capped": llmbatch.TenantLimits(max_in_flight=4)}
        async with llmbatch.Client(server.base_url, tenants=tenants) as client:
            async with anyio.create_task_group() as tg:

                async def capped_calls() -> None:
                    async with anyio.create_task_group() as calls:
                        for i in range(40):
                            calls.start_soon(
                                lambda i=i: client.complete(f"c{i}", tenant="capped", max_tokens=8)
                            )

                tg.start_soon(capped_calls)
                tg.start_soon(
                    lambda: client.map(
                        [f"capped {i}" for i in range(60)], tenant="capped", max_tokens=8
                    )
                )
                tg.start_soon(
                    lambda: client.map(
                        [f"free {i}" for i in range(300)], tenant="free", max_tokens=8
                    )
                )
            stats = client.stats()
        assert 1 <= server.peak_running(user="capped") <= 4
        assert server.peak_running(user="free") > 4
    assert stats.tenants["capped"].done == 100


async def test_overflow_raise_fails_a_call_at_once_and_affects_nothing_else() -> None:
    tenants = {"strict": llmbatch.TenantLimits(max_in_flight=1, overflow="raise")}
    with run_simulator() as slow:  # the modelled GPU's own speed: 16 tokens take ~0.3 s
        async with (
            llmbatch.Client(slow.base_url, tenants=tenants) as client,
            anyio.create_task_group() as tg,
        ):
            await _refused_while_held(client, tg)


async def _refused_while_held(client: llmbatch.Client, tg: Any) -> None:
    tg.start_soon(lambda: client.complete("one", tenant="strict", max_tokens=16))
    # Every task blocked: the first call was submitted and awaits its answer, holding
    # the tenant's one place.
    with anyio.fail_after(10):
        await anyio.wait_all_tasks_blocked()
    strict = client.stats().tenants["strict"]
    assert strict.in_flight + strict.queued == 1
    with pytest.raises(llmbatch.TenantQuotaExceeded) as info:
        await client.complete("two", tenant="strict", max_tokens=2)
    assert info.value.tenant == "strict"
    assert info.value.limit == "max_in_flight"
    # A map waits instead, and another tenant is not affected.
    results = await client.map(["a", "b", "c"], tenant="strict", max_tokens=2)
    assert all(r.ok for r in results)
    assert (await client.complete("x", tenant="other", max_tokens=2)).text


async def test_a_map_item_larger_than_its_tenants_quota_fails_alone(sim: SimulatorProcess) -> None:
    tenants = {"*": llmbatch.TenantLimits(max_in_flight_tokens=100)}
    async with llmbatch.Client(sim.base_url, tenants=tenants) as client:
        with pytest.raises(InvalidRequestError) as info:
            await client.complete("hi", tenant="t", max_tokens=500)
        assert info.value.field == "max_tokens"
        items: list[Any] = ["short", {"prompt": "long", "max_tokens": 500}, "short too"]
        results = await client.map(items, tenant="t", max_tokens=4)
    assert [r.ok for r in results] == [True, False, True]
    assert isinstance(results[1].error, InvalidRequestError)


@pytest.mark.parametrize(
    ("tenants", "error", "field"),
    [
        ({"a": 3}, llmbatch.ConfigTypeError, "tenants"),
        ([("a", 3)], llmbatch.ConfigTypeError, "tenants"),
        ({"": llmbatch.TenantLimits()}, llmbatch.ConfigError, "tenants"),
        (
            {"*": llmbatch.TenantLimits(tokens_per_minute=60, redis_url="redis://x", key="k")},
            llmbatch.ConfigError,
            "tenants",
        ),
    ],
)
def test_bad_tenants_are_refused_naming_the_field(
    tenants: Any, error: type[llmbatch.ConfigError], field: str
) -> None:
    with pytest.raises(error) as info:
        llmbatch.Client("http://127.0.0.1:9/v1", tenants=tenants)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"max_in_flight": 0}, llmbatch.ConfigError, "max_in_flight"),
        ({"max_in_flight": 2.5}, llmbatch.ConfigTypeError, "max_in_flight"),
        ({"max_in_flight_tokens": -1}, llmbatch.ConfigError, "max_in_flight_tokens"),
        ({"tokens_per_minute": float("nan")}, llmbatch.ConfigError, "tokens_per_minute"),
        ({"weight": 0}, llmbatch.ConfigError, "weight"),
        ({"overflow": "drop"}, llmbatch.ConfigError, "overflow"),
        ({"redis_url": "redis://localhost"}, llmbatch.ConfigError, "key"),
        ({"redis_url": "redis://h", "key": "k"}, llmbatch.ConfigError, "redis_url"),
        ({"max_in_flght": 2}, llmbatch.ConfigTypeError, "max_in_flght"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(
    kwargs: dict[str, Any], error: type[llmbatch.ConfigError], field: str
) -> None:
    with pytest.raises(error) as info:
        llmbatch.TenantLimits(**kwargs)
    assert info.value.field == field


def test_limits_repr_hides_the_redis_password() -> None:
    limits = llmbatch.TenantLimits(
        tokens_per_minute=600, redis_url="redis://u:secret@h:6379/0", key="team-a"
    )
    assert "secret" not in repr(limits)
    assert "team-a" in repr(limits)


async def test_send_tenant_as_user_off_lets_tenants_share_batches(sim: SimulatorProcess) -> None:
    async with llmbatch.Client(sim.base_url, send_tenant_as_user=False) as client:
        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(
                    lambda i=i: client.complete(f"p{i}", tenant=f"t{i % 10}", max_tokens=2)
                )
        stats = client.stats()
    assert sim.peak_running(user="t1") == 0  # not sent
    assert stats.batches_sent < 10  # the ten tenants' calls went together
