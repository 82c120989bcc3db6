"""Which server this is, and how it takes a request's priority, from what it says
about itself. Sans I/O: parsed answers in, a :class:`ServerKind` and a
:class:`PriorityField` out, so every rule is tested on recorded responses.

Each rule cites where the server documents what it answers:

- **vLLM** lists its models with ``"owned_by": "vllm"`` (``GET /v1/models``,
  docs.vllm.ai, "OpenAI-Compatible Server"). It takes ``priority`` as an int, lower
  first, under ``--scheduling-policy priority`` and refuses it with a 400 on
  ``fcfs``, which the dispatcher notices and stops sending.
- **SGLang** lists them with ``"owned_by": "sglang"`` and serves its server
  arguments at ``GET /get_server_info`` (docs.sglang.io, "SGLang Native APIs"). It
  honours ``priority`` only with ``--enable-priority-scheduling`` (otherwise it
  ignores it, or refuses it with ``--abort-on-priority-when-disabled``), and runs
  higher values first unless ``--schedule-low-priority-values-first``.
- **llama.cpp's server** lists them with ``"owned_by": "llamacpp"`` (its README,
  ``GET /v1/models``); it has no priority. It states how many sequences it runs at
  once: ``total_slots`` in ``GET /props`` (its ``--parallel``), which
  :func:`stated_seats` reads.
Anything else is a generic OpenAI-compatible server, Text Generation Inference
included: its model list does not say what it is (its own ``GET /info`` would, at
the cost of a request to every other server at open), and it takes no priority, so
it gets exactly what a generic server gets. A server whose priority
convention is not known (NVIDIA Dynamo and TensorRT-LLM order theirs differently:
higher first, or a float in [0, 1]) gets no priority field at all: a field read the
wrong way round would put bulk work ahead of realtime.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PriorityField",
    "ServerKind",
    "kind_from_models",
    "priority_field",
    "stated_seats",
]


class ServerKind(enum.StrEnum):
    """What kind of server answers (``stats().servers[i].kind``)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMA_CPP = "llama.cpp"
    GENERIC = "openai-compatible"


@dataclass(frozen=True, slots=True)
class PriorityField:
    """How a server reads the ``priority`` field: an int, and which end runs first."""

    lower_first: bool

    def value(self, rank: int) -> int:
        """The field's value for a tier's rank (0 realtime, 1 normal, 2 batch)."""
        return rank if self.lower_first else _LOWEST_RANK - rank


_LOWEST_RANK = 2
#: What ``/v1/models``' ``owned_by`` says of each server that says it.
_OWNERS = {
    "vllm": ServerKind.VLLM,
    "sglang": ServerKind.SGLANG,
    "llamacpp": ServerKind.LLAMA_CPP,
}


def kind_from_models(models: Sequence[Mapping[str, object]]) -> ServerKind | None:
    """The kind named by the models' ``owned_by`` (None when it names none we know)."""
    for model in models:
        kind = _OWNERS.get(str(model.get("owned_by", "")).lower())
        if kind is not None:
            return kind
    return None


def priority_field(kind: ServerKind, server_info: object = None) -> PriorityField | None:
    """How ``kind`` takes ``priority`` (None: send none). ``server_info`` is SGLang's
    ``GET /get_server_info`` answer, which says whether priority scheduling is on and
    which way it orders (None: not read, so nothing is sent)."""
    if kind is ServerKind.VLLM:
        return PriorityField(lower_first=True)
    if kind is ServerKind.SGLANG and isinstance(server_info, Mapping):
        if not server_info.get("enable_priority_scheduling"):
            return None
        return PriorityField(
            lower_first=bool(server_info.get("schedule_low_priority_values_first"))
        )
    return None


def stated_seats(kind: ServerKind, props: object) -> int | None:
    """How many sequences the server says it runs at once: llama.cpp's ``GET /props``
    ``total_slots`` (None: not stated, or not read)."""
    if kind is ServerKind.LLAMA_CPP and isinstance(props, Mapping):
        slots = props.get("total_slots")
        if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
            return slots
    return None
