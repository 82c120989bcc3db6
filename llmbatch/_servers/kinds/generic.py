"""Any other OpenAI-compatible server, Text Generation Inference included.

Its model list does not say what it is (TGI's own ``GET /info`` would, at the cost
of a request to every other server at open), and it takes no priority: a server
whose convention is not known (NVIDIA Dynamo and TensorRT-LLM order theirs
differently: higher first, or a float in [0, 1]) gets no priority field, since one
read the wrong way round would put bulk work ahead of realtime. A JSON schema goes
as OpenAI's ``response_format`` (vLLM's ``guided_json`` too); vLLM's other
``guided_*`` fields have no common form and are refused.
"""

from __future__ import annotations

import re

from llmbatch._servers.kinds.base import Dialect, ServerKind

__all__ = ["DIALECT"]

DIALECT = Dialect(
    kind=ServerKind.GENERIC,
    too_long=(
        # TGI's validation: "Input validation error: `inputs` tokens +
        # `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200
        # `max_new_tokens`"
        re.compile(r"`inputs` tokens \+ `max_new_tokens` must be <= (?P<limit>\d+)"),
    ),
)
"""A generic OpenAI-compatible server's rules."""
