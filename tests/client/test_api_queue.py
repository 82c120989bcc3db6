"""A queue in the server's API process, on a real simulator whose API process takes
50 ms a request: the client sees its requests held there (its in flight less the
engine's running and waiting), believes it once it lasts, and under an SLO cuts bulk
for it as for the engine's queue; a fast API process shows none that lasts."""

from __future__ import annotations

import json
import pathlib

import anyio
import pytest

from llmbatch import SLO, BatchPolicy, Client, Limits

pytestmark = pytest.mark.anyio


def write_fit(path: pathlib.Path, per_request: float) -> str:
    step = {
        "base": 0.002,
        "per_sequence": 0.0001,
        "per_prefill_token": 0.0,
        "per_request": per_request,
        "per_prompt": 0.0,
        "jitter": 0.0,
    }
    fit = {"format": 1, "model": "m", "step": step, "idle_ttft_s": 0.01, "idle_tpot_s": 0.002}
    path.write_text(json.dumps(fit))
    return str(path)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("per_request", [0.05, 0.0])
async def test_requests_held_in_the_api_process_cut_bulk_under_an_slo(
    tmp_path: pathlib.Path, per_request: float
) -> None:
    from llmbatch_server.testing import run_simulator

    fit = write_fit(tmp_path / "fit.json", per_request)
    with run_simulator("--fitted", fit) as sim:
        async with Client(
            sim.base_url,
            slo=SLO(tpot=0.05, ttft=0.5),
            limits=Limits(max_in_flight=64, reserved_realtime=2),
            # One prompt a request: each costs the API process its 50 ms.
            batching={"batch": BatchPolicy(max_batch_size=1)},
        ) as client:
            held: list[int] = []
            limits: list[int] = []
            learnt = False

            async def watch() -> None:
                nonlocal learnt
                while True:
                    server = client.stats().servers[0]
                    held.append(server.api_queue or 0)
                    limits.append(server.bulk_limit)
                    learnt |= any(
                        i.name == "api_queue" and i.source == "learnt" for i in server.inferences
                    )
                    await anyio.sleep(0.1)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                results = await client.map(
                    [f"p {i}" for i in range(80)], max_tokens=64, ignore_eos=True
                )
                tg.cancel_scope.cancel()
    assert all(r.ok for r in results)
    if per_request:
        assert max(held) > 4
        assert learnt
        assert min(limits[len(limits) // 2 :]) < 8  # cut below where it started
    else:
        # A read may catch a flood just sent, once: it does not last.
        assert not learnt
