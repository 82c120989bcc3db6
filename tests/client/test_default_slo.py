"""The default SLO (``slo="auto"``) is what every constructor gets, ``None`` turns it
off everywhere, and a wrong value is refused naming the field; on a real simulator
the default says what it aims at once realtime calls run beside bulk work."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import pytest

import llmbatch
from llmbatch import SLO, Client, Limits, SyncClient
from llmbatch._jobs import cli as run_cli

URL = "http://127.0.0.1:1/v1"


def slo_of(client: Client | SyncClient) -> Any:
    inner = client._client if isinstance(client, SyncClient) else client
    return inner._config.slo


def test_client_and_sync_client_default_to_auto_and_take_none() -> None:
    assert slo_of(Client(URL)) == "auto"
    assert slo_of(Client(URL, slo=None)) is None
    assert slo_of(SyncClient(URL)) == "auto"
    assert slo_of(SyncClient(URL, slo=None)) is None
    stated = SLO(tpot=0.05)
    assert slo_of(Client(URL, slo=stated)) is stated


def test_a_static_setting_turns_the_default_off_and_keeps_a_stated_slo_refused() -> None:
    static = Limits(max_in_flight=16, reserved_realtime=8, adaptive=False)
    assert slo_of(Client(URL, limits=static)) is None


@pytest.mark.parametrize("value", ["fast", 0.05, True])
def test_a_wrong_slo_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(llmbatch.ConfigTypeError, match='"auto"') as info:
        Client(URL, slo=value)  # type: ignore[arg-type]
    assert info.value.field == "slo"


def test_the_openai_drop_ins_pass_it_through() -> None:
    pytest.importorskip("openai")
    from llmbatch.openai import AsyncOpenAI, OpenAI

    for make in (AsyncOpenAI, OpenAI):
        # The batching client is made at the first request, from these options: the
        # default's are Client's own.
        default = make(base_url=URL, api_key="k")._llmbatch
        off = make(base_url=URL, api_key="k", llmbatch_options={"slo": None})._llmbatch
        assert default is not None
        assert off is not None
        assert "slo" not in default._options
        assert slo_of(Client(URL, **off._options)) is None


def test_llmbatch_run_takes_slo_auto_or_none() -> None:
    parser = argparse.ArgumentParser()
    run_cli.add_parser(parser.add_subparsers())
    default = parser.parse_args(["run", "in.jsonl", "-o", "out.jsonl"])
    off = parser.parse_args(["run", "in.jsonl", "-o", "out.jsonl", "--slo", "none"])
    assert run_cli._config(default, None).slo == "auto"
    assert run_cli._config(off, None).slo is None
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "in.jsonl", "-o", "out.jsonl", "--slo", "fast"])


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_on_a_real_server_the_default_measures_then_aims_at_three_times_idle() -> None:
    from llmbatch_server.testing import run_simulator

    with run_simulator("--speed", "50") as sim:
        async with Client(sim.base_url, on_close="cancel") as client:
            assert client.stats().servers[0].slo_auto.startswith("dormant")  # type: ignore[union-attr]

            async def bulk() -> None:
                prompts = (f"bulk {i}" for i in range(100_000))
                async for _ in client.map_unordered(prompts, max_tokens=32, ignore_eos=True):
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(bulk)
                await anyio.sleep(0.5)
                phases = []
                with anyio.fail_after(60):
                    while True:
                        await client.complete("hi", priority="realtime", max_tokens=16)
                        phase = client.stats().servers[0].slo_auto or ""
                        phases.append(phase.split(":")[0])
                        if phase.startswith(("active", "stood_down")):
                            break
                        await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
            server = client.stats().servers[0]
    assert "measuring" in phases
    assert server.slo_auto is not None
    assert server.slo_auto.startswith("active"), server.slo_auto
    target = server.inference("slo_auto")
    assert target is not None
    assert target.value is not None
    # 3x the quiet step: the step then was the simulator's at one or two sequences.
    assert target.value < 3 * (server.step_time or 1.0) * 3
    assert "3x the idle latency" in str(client.stats())
