"""The simulator counts running sequences per OpenAI ``user``, so a test can check at
the server what each caller had running (issue #23's per-tenant limits)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from llmbatch_server.testing import run_simulator


def test_peak_running_is_counted_per_user() -> None:
    async def send(http: httpx.AsyncClient, user: str | None, prompts: int) -> None:
        body: dict[str, object] = {
            "model": "llmbatch-sim",
            "prompt": ["x"] * prompts,
            "max_tokens": 20,
            "ignore_eos": True,
        }
        if user is not None:
            body["user"] = user
        (await http.post("/completions", json=body)).raise_for_status()

    async def main(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await asyncio.gather(
                send(http, "agent-7", 3), send(http, 'odd "name"', 2), send(http, None, 5)
            )

    with run_simulator("--speed", "20") as sim:
        assert sim.peak_running(user="agent-7") == 0  # before: not a series yet
        asyncio.run(main(sim.base_url))
        assert sim.peak_running(user="agent-7") == 3
        assert sim.peak_running(user='odd "name"') == 2
        assert sim.peak_running() == 10
        assert 'llmbatch_sim:peak_running_by_user{model_name="llmbatch-sim",user="agent-7"} 3' in (
            sim.metrics()
        )


def test_a_user_that_is_not_a_string_is_refused() -> None:
    with run_simulator("--speed", "50") as sim:
        body = {"model": "llmbatch-sim", "prompt": "x", "max_tokens": 2, "user": 7}
        response = httpx.post(sim.base_url + "/completions", json=body, timeout=10)
    assert response.status_code == 400
    assert "'user' must be a string" in response.text


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_a_user_is_accepted_on_both_routes(path: str) -> None:
    with run_simulator("--speed", "50") as sim:
        body: dict[str, object] = {"model": "llmbatch-sim", "max_tokens": 2, "user": "u1"}
        if path == "/chat/completions":
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = "hi"
        response = httpx.post(sim.base_url + path, json=body, timeout=10)
        assert response.status_code == 200
        assert sim.peak_running(user="u1") == 1
