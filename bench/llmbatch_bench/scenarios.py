"""Any :class:`~llmbatch_bench.jobs.Job` in the process that runs it: the contender
workloads of :mod:`.workloads` (``bulk``, ``mixed``, ``idle``), the steady-state kinds
of :mod:`.hotpath.steady`, :mod:`.hotpath.references` and :mod:`.hotpath.program`,
the closed-loop kinds of :mod:`.closedloop.jobs` and the replicas jobs of
:mod:`.replicas.jobs`.
"""

from __future__ import annotations

from llmbatch_bench.closedloop import jobs as closedloop
from llmbatch_bench.contenders import Contender, contender_for
from llmbatch_bench.hotpath import program, references
from llmbatch_bench.hotpath import steady as hotpath
from llmbatch_bench.jobs import Job
from llmbatch_bench.metrics import RunMetrics
from llmbatch_bench.replicas import jobs as replicajobs
from llmbatch_bench.workloads import run_workload

__all__ = ["run_job"]


async def run_job(job: Job, contender: Contender | None = None) -> RunMetrics:
    """Run ``job`` in this process; ``contender`` overrides the one a ``bulk``,
    ``mixed`` or ``idle`` job names (tests pass one over a mock transport)."""
    steady = {
        "llmbatch": hotpath.run_llmbatch,
        "probe": references.run_probe,
        "per_prompt": references.run_per_prompt,
        "raw": references.run_raw,
        "bare": references.run_bare,
        "program": program.run_program,
        "outage": closedloop.run_outage,
        "control": closedloop.run_control,
        "replicas": replicajobs.run_replicas,
    }.get(job.kind)
    if steady is not None:
        return await steady(job)
    if contender is None:
        contender = contender_for(job)
    return await run_workload(job, contender)
