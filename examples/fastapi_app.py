"""A FastAPI service: realtime chat (streamed) and background bulk jobs on one client.

    LLMBATCH_BASE_URL=http://127.0.0.1:8000/v1 python examples/fastapi_app.py --port 8080
    curl -N localhost:8080/chat -d '{"message": "hi"}' -H 'content-type: application/json'
    curl -X POST localhost:8080/jobs -H 'content-type: application/json' \
        -d '{"prompts": ["a", "b"]}'
    curl localhost:8080/jobs/1

Chat requests go at priority "realtime" and bulk jobs at "batch", so chat latency
holds while a job runs: the client keeps the server just full and sends realtime
work first. ``/stats`` shows the client's per-tier numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

import llmbatch


class ChatIn(BaseModel):
    message: str
    max_tokens: int = 64


class JobIn(BaseModel):
    prompts: list[str]
    max_tokens: int = 64


@dataclass
class Job:
    total: int
    done: int = 0
    failed: int = 0
    results: list[str | None] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.done + self.failed == self.total


def create_app() -> FastAPI:
    jobs: dict[int, Job] = {}
    ids = itertools.count(1)
    background: set[asyncio.Task[None]] = set()
    state: dict[str, llmbatch.Client] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One client for the whole service; leaving drains queued work.
        async with llmbatch.Client() as client:
            state["client"] = client
            yield

    app = FastAPI(title="llmbatch example", lifespan=lifespan)

    @app.post("/chat")
    async def chat(body: ChatIn) -> StreamingResponse:
        client = state["client"]
        messages = [{"role": "user", "content": body.message}]

        async def tokens() -> AsyncIterator[str]:
            async for delta in client.stream(
                messages, priority="realtime", max_tokens=body.max_tokens
            ):
                yield delta

        return StreamingResponse(tokens(), media_type="text/plain")

    @app.post("/jobs")
    async def start_job(body: JobIn) -> dict[str, int]:
        job_id = next(ids)
        job = jobs[job_id] = Job(total=len(body.prompts), results=[None] * len(body.prompts))

        async def run() -> None:
            client = state["client"]
            async for index, result in client.map_unordered(
                body.prompts, priority="batch", max_tokens=body.max_tokens
            ):
                if result.ok:
                    job.done += 1
                    job.results[index] = result.unwrap().text
                else:
                    job.failed += 1

        task = asyncio.create_task(run())
        background.add(task)
        task.add_done_callback(background.discard)
        return {"job": job_id, "total": job.total}

    @app.get("/jobs/{job_id}")
    async def job_status(job_id: int) -> dict[str, Any]:
        job = jobs.get(job_id)
        if job is None:
            raise HTTPException(404, "no such job")
        return {
            "total": job.total,
            "done": job.done,
            "failed": job.failed,
            "finished": job.finished,
        }

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        s = state["client"].stats()
        return {
            tier.value: {
                "done": t.done,
                "queued": t.queued,
                "in_flight": t.in_flight,
                "latency_p99": t.latency.p99,
            }
            for tier, t in s.tiers.items()
        }

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="FastAPI + llmbatch example service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
