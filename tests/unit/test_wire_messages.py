"""What servers say in their error messages, parsed on strings alone.

Each text is what that server sends (vLLM's from its own source and this project's
real-vLLM stage; the others as their servers word them and as OpenAI-compatible
clients record them). A server's words missing here are not an error: a batch it
refuses whole is halved until the bad prompt fails alone, only more slowly.
"""

from __future__ import annotations

import pytest

from llmbatch._servers.wire import TooLong, priority_refused, too_long

TOO_LONG = [
    pytest.param(
        "This model's maximum context length is 4096 tokens. However, you requested "
        "4200 tokens (4100 in the messages, 100 in the completion). Please reduce the "
        "length of the messages or completion.",
        TooLong(4096, 4100),
        id="vllm-requested",
    ),
    pytest.param(
        "This model's maximum context length is 2048 tokens. However, your request has "
        "5000 input tokens. Please reduce the length of the input messages.",
        TooLong(2048, 5000),
        id="vllm-input-tokens",
    ),
    pytest.param(
        "Requested token count exceeds the model's maximum context length of 32768 "
        "tokens. You requested a total of 67298 tokens: 50914 tokens from the input "
        "messages and 16384 tokens for the completion.",
        TooLong(32768, 50914),
        id="vllm-new-and-sglang",
    ),
    pytest.param(
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        TooLong(None, 5000),
        id="sglang-tokenizer",
    ),
    pytest.param(
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
        "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
        TooLong(4096, 4000),
        id="tgi",
    ),
    pytest.param(
        "the request exceeds the available context size, try increasing it",
        TooLong(None, None),
        id="llama.cpp",
    ),
]


@pytest.mark.parametrize(("message", "expected"), TOO_LONG)
def test_a_prompt_too_long_is_recognised_in_each_servers_words(
    message: str, expected: TooLong
) -> None:
    assert too_long(message) == expected


@pytest.mark.parametrize(
    "message",
    [
        "temperature must be non-negative, got -1.0.",
        "The model `gpt-4` does not exist.",
        "max_tokens must be at least 1, got 0.",
        "",
    ],
)
def test_other_refusals_are_not_taken_for_a_prompt_too_long(message: str) -> None:
    assert too_long(message) is None


def test_a_refused_priority_field() -> None:
    assert priority_refused("Priority scheduling is not enabled.")
    assert priority_refused("priority scheduling is not enabled for this server")
    assert not priority_refused("priority must be an integer")
