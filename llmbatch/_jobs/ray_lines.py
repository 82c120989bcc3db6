"""What runs on Ray's workers for ``llmbatch run --ray``: the check of one input
shard, and :class:`JobLines`, the ``map_batches`` class that answers a batch of
input lines and appends their output records to the actor's own shard.

Nothing here imports Ray, so both can be called directly in tests.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbatch._config import Limits, PriorityLike
from llmbatch._exceptions import LLMBatchError, ServerInfoError
from llmbatch._jobs.format import (
    JobLine,
    MalformedLine,
    answer_of,
    asks_for_json,
    failure_record,
    parse_line,
    result_record,
    to_map_input,
)
from llmbatch._jobs.input import scan_input
from llmbatch._jobs.output import OutputFile
from llmbatch._jobs.runner import JOB_FATAL, REPORT_LIMIT, JobConfig, stop_reason
from llmbatch._jobs.shards import shard_name
from llmbatch._runtime.map import MapInput
from llmbatch.ray import _column, _Rows

__all__ = ["COUNTS", "FileCheck", "JobLines", "JobStopped", "check_file"]

#: The columns of the one-row summary each batch returns to the driver.
COUNTS = (
    "done",
    "failed",
    "malformed",
    "already_done",
    "retried",
    "prompt_tokens",
    "completion_tokens",
)
#: The column ``ray.data.read_text`` puts each input line in.
TEXT_COLUMN = "text"


class JobStopped(LLMBatchError):
    """An error every remaining request would get too (the server unreachable, a
    wrong key, an unknown model): the run stops, as the single-process run does."""

    def __init__(self, why: str, hint: str) -> None:
        super().__init__(why)
        self.why = why
        self.hint = hint
        self.args = (why, hint)  # so it survives the pickling back to the driver


@dataclass(slots=True)
class FileCheck:
    """What the checking pass found in one input shard."""

    path: str
    model: str | None
    lines: int = 0
    """Valid lines (custom_ids)."""
    pending: int = 0
    """Valid lines whose custom_id is not in the output yet."""
    malformed: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    """The first few malformed lines and duplicates, ``path:line: reason``."""


def check_file(path: str, model: str | None, done: Collection[str]) -> FileCheck:
    """Check one input shard as ``llmbatch run`` checks its file (malformed lines,
    duplicate custom_ids, one model per file unless ``model`` is given)."""
    scan = scan_input(Path(path), model=model)
    found = sorted([*scan.malformed, *scan.duplicates], key=lambda m: m.line_no)
    return FileCheck(
        path=path,
        model=scan.model,
        lines=len(scan.ids),
        pending=sum(1 for custom_id in scan.ids if custom_id not in done),
        malformed=len(scan.malformed),
        duplicates=len(scan.duplicates),
        problems=[f"{path}:{m.line_no}: {m.reason}" for m in found[:REPORT_LIMIT]],
    )


class JobLines(_Rows):
    """Answers a batch of OpenAI Batch API lines (a ``text`` column, as
    ``ray.data.read_text`` gives) and appends one output record per line to
    ``output_dir/part-*.jsonl``, a shard of this actor's own; returns the batch's
    counts as one row (:data:`COUNTS`).

    Lines whose custom_id is in ``done`` are skipped, as are malformed lines (the
    checking pass already decided whether the job may run with them). ``model``
    is the job's model; with ``check_model`` a line naming another is malformed.
    """

    _kinds = ("completion", "chat")

    def __init__(
        self,
        output_dir: str,
        *,
        input_name: str,
        base_url: str | Sequence[str] | None,
        api_key: str | None,
        model: str | None,
        check_model: bool,
        priority: PriorityLike,
        limits: Limits,
        client_options: Mapping[str, Any],
        done: Collection[str] = frozenset(),
        tenant: str | None = None,
    ) -> None:
        super().__init__(
            base_url,
            column=TEXT_COLUMN,
            api_key=api_key,
            model=model,
            priority=priority,
            limits=limits,
            client_options=client_options,
            params={} if tenant is None else {"tenant": tenant},
        )
        self._output_dir = Path(output_dir)
        self._model = model
        self._check_model = check_model
        self._done = done
        # stop_reason words its advice from the job's options, as the CLI names them.
        self._job = JobConfig(
            input=Path(input_name), output=self._output_dir, model=None if check_model else model
        )
        self._out: OutputFile | None = None
        # Ray may run two batches of one actor at once, on two threads.
        self._writing = threading.Lock()
        self._retried_seen = 0

    def __call__(self, batch: Any) -> dict[str, list[int]]:
        counts = dict.fromkeys(COUNTS, 0)
        lines: list[JobLine] = []
        for text in _column(batch, self._column):
            line = self._parse(str(text))
            if line is None:
                counts["malformed"] += 1
            elif line.custom_id in self._done:
                counts["already_done"] += 1
            else:
                lines.append(line)
        try:
            answers = self._answer(lines)
        except (ServerInfoError, *JOB_FATAL) as exc:  # raised as the client opened
            raise JobStopped(*stop_reason(exc, self._job)) from None
        fatal: LLMBatchError | None = None
        with self._writing:
            out = self._output() if lines else None
            for line, (result, error) in zip(lines, answers, strict=True):
                assert out is not None
                if isinstance(error, JOB_FATAL):
                    fatal = error  # not written: the rerun sends it again
                    continue
                if result is None:  # refused before it was sent
                    out.write(failure_record(line.custom_id, error))  # type: ignore[arg-type]
                    counts["failed"] += 1
                    continue
                json_answer = asks_for_json(line.body)
                out.write(result_record(line.custom_id, result, json_answer=json_answer))
                if error is None:
                    answer = answer_of(result)
                    counts["done"] += 1
                    counts["prompt_tokens"] += answer.usage.prompt_tokens
                    counts["completion_tokens"] += answer.usage.completion_tokens
                else:
                    counts["failed"] += 1
            counts["retried"] = self._retried()
        if fatal is not None:
            raise JobStopped(*stop_reason(fatal, self._job))
        return {name: [count] for name, count in counts.items()}

    def close(self) -> None:
        """Close the client and this actor's output shard (fsynced)."""
        try:
            super().close()
        finally:
            with self._writing:
                if self._out is not None:
                    self._out.__exit__(None, None, None)
                    self._out = None

    def _parse(self, text: str) -> JobLine | None:
        try:
            line = parse_line(text.encode(), 0)
        except MalformedLine:
            return None
        if line is None or (
            self._check_model and line.model is not None and line.model != self._model
        ):
            return None
        return line

    def _input(self, value: Any) -> MapInput:
        assert isinstance(value, JobLine)
        return to_map_input(value)

    def _output(self) -> OutputFile:
        if self._out is None:
            # The driver's lock on the directory covers the shard. A shard lock of
            # its own would outlive the run: Ray stops a finished run's actors when
            # it gets round to it, and a rerun must be able to read their shards.
            out = OutputFile(self._output_dir / shard_name(), lock=False)
            self._out = out.__enter__()
        return self._out

    def _retried(self) -> int:
        """Retries since the last batch (the client counts them for its lifetime)."""
        if not self._open:
            return 0
        total = self._client.stats().tiers[self._priority].retried
        delta, self._retried_seen = total - self._retried_seen, total
        return delta
