"""``run_job`` end to end through MockTransport: format, resume, torn lines, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_server import POISON, FakeServer
from jobfiles import chat_line, completion_line, id_counts, read_output, write_jsonl

from llmbatch import ConnectError, RetryPolicy
from llmbatch._jobs.runner import JobConfig, JobRejected, JobSummary, run_job
from llmbatch.transports import HTTPRequest, MockResponse, MockTransport

pytestmark = pytest.mark.anyio

NO_WAIT_RETRY = RetryPolicy(attempts=3, initial_backoff=0.0, max_backoff=0.0)


def prompts_sent(fake: FakeServer) -> list[str]:
    sent: list[str] = []
    for body in fake.bodies:
        if "prompt" in body:
            prompt = body["prompt"]
            sent += prompt if isinstance(prompt, list) else [prompt]
        elif isinstance(body["messages"][0], list):  # the chat batch route
            sent += [conversation[-1]["content"] for conversation in body["messages"]]
        else:
            sent.append(body["messages"][-1]["content"])
    return sent


async def run(
    tmp_path: Path, handler: Any, notices: list[str] | None = None, **kw: Any
) -> JobSummary:
    config = JobConfig(
        input=tmp_path / "in.jsonl",
        output=tmp_path / "out.jsonl",
        transport=MockTransport(handler),
        retry=NO_WAIT_RETRY,
        **kw,
    )
    return await run_job(config, report=(notices if notices is not None else []).append)


def mixed(n: int) -> list[dict[str, Any] | str]:
    return [
        completion_line(f"id-{i}", f"prompt {i}", max_tokens=2)
        if i % 2
        else chat_line(f"id-{i}", f"chat {i}")
        for i in range(n)
    ]


async def test_every_line_gets_one_openai_output_line(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(30))
    fake = FakeServer()
    summary = await run(tmp_path, fake)
    assert id_counts(tmp_path / "out.jsonl") == {f"id-{i}": 1 for i in range(30)}
    records = {r["custom_id"]: r for r in read_output(tmp_path / "out.jsonl")}
    chat = records["id-0"]["response"]["body"]
    assert chat["choices"][0]["message"]["content"] == "re:chat 0"
    completion = records["id-1"]["response"]["body"]
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == "echo:prompt 1:0"
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in records.values())
    # Completions went out batched as list prompts, with the file's model.
    assert any(isinstance(b.get("prompt"), list) for b in fake.bodies)
    assert {b["model"] for b in fake.bodies} == {"fake-model"}
    assert (summary.input_lines, summary.done, summary.failed, summary.already_done) == (
        30,
        30,
        0,
        0,
    )
    assert summary.completion_tokens == 15 * 2 + 15 * 2
    assert summary.complete


async def test_a_rerun_sends_only_what_the_output_lacks(tmp_path: Path) -> None:
    lines = mixed(10)
    write_jsonl(tmp_path / "in.jsonl", lines[:4])
    await run(tmp_path, FakeServer())
    write_jsonl(tmp_path / "in.jsonl", lines)
    fake = FakeServer()
    summary = await run(tmp_path, fake)
    assert sorted(prompts_sent(fake)) == sorted(
        f"prompt {i}" if i % 2 else f"chat {i}" for i in range(4, 10)
    )
    assert (summary.already_done, summary.done) == (4, 6)
    assert id_counts(tmp_path / "out.jsonl") == {f"id-{i}": 1 for i in range(10)}
    # A third run has nothing to do and sends nothing.
    idle = FakeServer()
    summary = await run(tmp_path, idle)
    assert idle.bodies == []
    assert (summary.already_done, summary.done, summary.complete) == (10, 0, True)


async def test_a_torn_last_line_is_redone_exactly_once(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(6))
    await run(tmp_path, FakeServer())
    out = tmp_path / "out.jsonl"
    data = out.read_bytes()
    last_id = read_output(out)[-1]["custom_id"]
    out.write_bytes(data[:-15])  # killed in the middle of writing the last line
    fake, notices = FakeServer(), []
    summary = await run(tmp_path, fake, notices)
    assert summary.done == 1
    assert len(fake.bodies) == 1
    assert id_counts(out) == {f"id-{i}": 1 for i in range(6)}
    assert read_output(out)[-1]["custom_id"] == last_id
    assert any("partial last line" in n for n in notices)


async def test_malformed_lines_are_rejected_by_default_and_nothing_is_sent(
    tmp_path: Path,
) -> None:
    lines = mixed(5)
    lines[1] = "{oops"
    lines[3] = '{"custom_id": "x", "method": "POST", "url": "/v1/files", "body": {}}'
    write_jsonl(tmp_path / "in.jsonl", lines)
    fake, notices = FakeServer(), []
    with pytest.raises(JobRejected, match="2 malformed line"):
        await run(tmp_path, fake, notices)
    assert fake.bodies == []
    assert not (tmp_path / "out.jsonl").exists()
    assert notices[0].startswith(f"{tmp_path / 'in.jsonl'}:2: not valid JSON")
    assert "in.jsonl:4: url must be one of" in notices[1]


async def test_malformed_lines_can_be_skipped_and_valid_lines_still_run(tmp_path: Path) -> None:
    lines = mixed(5)
    lines[2] = "[1, 2]"
    write_jsonl(tmp_path / "in.jsonl", lines)
    notices: list[str] = []
    summary = await run(tmp_path, FakeServer(), notices, on_malformed="skip")
    assert id_counts(tmp_path / "out.jsonl") == {"id-0": 1, "id-1": 1, "id-3": 1, "id-4": 1}
    assert (summary.malformed, summary.done) == (1, 4)
    assert notices[0].endswith("in.jsonl:3: not a JSON object")


async def test_duplicate_custom_ids_are_rejected_with_line_numbers(tmp_path: Path) -> None:
    lines = [*mixed(4), completion_line("id-1", "again"), "", completion_line("id-1", "3rd")]
    write_jsonl(tmp_path / "in.jsonl", lines)
    fake, notices = FakeServer(), []
    with pytest.raises(JobRejected, match="2 duplicate custom_id"):
        await run(tmp_path, fake, notices, on_malformed="skip")
    assert fake.bodies == []
    assert not (tmp_path / "out.jsonl").exists()
    assert notices == [
        f"{tmp_path / 'in.jsonl'}:5: duplicate custom_id 'id-1' (first on line 2)",
        f"{tmp_path / 'in.jsonl'}:7: duplicate custom_id 'id-1' (first on line 2)",
    ]


async def test_lines_for_another_model_are_malformed_unless_model_is_given(
    tmp_path: Path,
) -> None:
    write_jsonl(
        tmp_path / "in.jsonl",
        [completion_line("a", "x"), completion_line("b", "y", model="other")],
    )
    with pytest.raises(JobRejected):
        await run(tmp_path, FakeServer())
    fake = FakeServer()
    summary = await run(tmp_path, fake, model="fake-model")
    assert summary.done == 2
    assert {b["model"] for b in fake.bodies} == {"fake-model"}


async def test_a_failed_request_gets_an_error_line_and_can_be_retried(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "in.jsonl",
        [completion_line("good", "fine"), completion_line("bad", f"a {POISON} b")],
    )
    summary = await run(tmp_path, FakeServer())
    assert (summary.done, summary.failed, summary.complete) == (1, 1, True)
    assert summary.retried == 0  # the 400 bisection is not a retry
    records = {r["custom_id"]: r for r in read_output(tmp_path / "out.jsonl")}
    assert records["bad"]["response"]["status_code"] == 400
    assert records["bad"]["response"]["body"]["error"]["message"] == "This prompt is poisoned"
    assert records["bad"]["error"]["code"] == "bad_request_error"
    # A plain rerun keeps the failure; --retry-failed sends it again.
    again = FakeServer()
    summary = await run(tmp_path, again)
    assert (summary.earlier_failures, again.bodies) == (1, [])
    retry = FakeServer()
    summary = await run(tmp_path, retry, retry_failed=True)
    assert prompts_sent(retry) == [f"a {POISON} b"]
    assert id_counts(tmp_path / "out.jsonl") == {"good": 1, "bad": 1}


async def test_retried_requests_are_counted(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x"), chat_line("b", "y")])
    fake = FakeServer(chat_batch=False)  # one exchange per conversation: one is retried
    seen: set[str] = set()

    def flaky(body: dict[str, Any]) -> MockResponse | None:
        content = body["messages"][-1]["content"]
        if content == "x" and content not in seen:
            seen.add(content)
            return MockResponse(status=500, json={"error": {"message": "hiccup"}})
        return None

    fake.intercept = flaky
    summary = await run(tmp_path, fake)
    assert (summary.done, summary.retried) == (2, 1)


async def test_an_unreachable_server_stops_the_job_without_recording_failures(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(8))
    fake = FakeServer()

    def down(request: HTTPRequest) -> MockResponse:
        if request.url.endswith("/models"):
            return fake(request)
        raise ConnectError("connection refused")

    summary = await run(tmp_path, down)
    assert summary.stopped is not None
    assert "ConnectError" in summary.stopped
    assert not summary.complete
    assert read_output(tmp_path / "out.jsonl") == []
    # Back up: a rerun does everything.
    summary = await run(tmp_path, FakeServer())
    assert summary.done == 8
    assert id_counts(tmp_path / "out.jsonl") == {f"id-{i}": 1 for i in range(8)}


async def test_a_wrong_api_key_stops_the_job(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(3))
    fake = FakeServer()
    fake.intercept = lambda body: MockResponse(status=401, json={"error": {"message": "bad key"}})
    summary = await run(tmp_path, fake)
    assert summary.stopped == "AuthenticationError: bad key"
    assert summary.hint == (
        "check the API key ($LLMBATCH_API_KEY, $OPENAI_API_KEY or --api-key); "
        "then rerun the same command to resume"
    )
    assert read_output(tmp_path / "out.jsonl") == []


async def test_a_key_refused_at_open_stops_the_job_the_same_way(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(3))

    def refuse(request: HTTPRequest) -> MockResponse:
        return MockResponse(status=401, json={"error": "Unauthorized"})

    summary = await run(tmp_path, refuse, base_url="http://h:1/v1", api_key="sk-nope")
    assert summary.stopped == (
        "AuthenticationError: the server at http://h:1/v1 refused the API key "
        "(401: Unauthorized); check the key (it is not shown here)"
    )
    assert "--api-key" in str(summary.hint)
    assert not summary.complete


async def test_a_base_url_without_v1_stops_the_job_suggesting_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mixed(3))
    fake = FakeServer()

    def v1_only(request: HTTPRequest) -> MockResponse:
        if request.url.startswith("http://h:1/v1/"):
            return fake(request)
        return MockResponse(status=404, json={"detail": "Not Found"})

    summary = await run(tmp_path, v1_only, base_url="http://h:1")
    assert str(summary.stopped).endswith("did you mean http://h:1/v1?")
    assert str(summary.hint).startswith("check --base-url")
    assert fake.bodies == []  # nothing sent
