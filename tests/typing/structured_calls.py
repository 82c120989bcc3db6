"""Checked by tests/typing/test_types.py with mypy: the answer's type follows
``response_model``, and a misspelt keyword is a type error (not only at run time)."""

from typing import Literal

from pydantic import BaseModel

import llmbatch


class P(BaseModel):
    x: int


async def calls(c: llmbatch.Client, s: llmbatch.SyncClient) -> None:
    a = await c.complete("x", response_model=P)
    reveal_type(a.parsed)  # P
    b = await c.complete("x")
    reveal_type(b.parsed)  # None
    r = await c.map(["x"], response_model=P)
    reveal_type(r[0].value)  # P | None
    many = await c.chat([{"role": "user", "content": "x"}], response_model=list[P])
    reveal_type(many.parsed)  # list[P]
    lit = await c.chat([{"role": "user", "content": "x"}], response_model=Literal["a", "b"])
    reveal_type(lit.parsed)  # Any
    async for item in c.imap(["x"], response_model=P):
        reveal_type(item.value)  # P | None
    reveal_type(s.map(["x"], response_model=P))  # list[Result[P]]
    await c.complete("x", max_tokns=3)  # error: did you mean "max_tokens"?
