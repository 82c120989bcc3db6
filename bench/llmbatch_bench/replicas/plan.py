"""The replicas scenario as runs: what each job measures, under which label (the
targets and the report find runs by them), and how the prefix jobs' KV cache is sized.

Every job starts its own simulators (``replicas_sim_args`` each) in its worker and
stops them after, so no job inherits another's caches or queues:

- throughput: the same bulk ``map`` against one replica, then against all of them
  through one client (``replicas_bulk_n`` prompts per replica);
- prefix-heavy work: ``replicas_prefix_n`` prompts sharing ``replicas_prefixes``
  system prompts, through one llmbatch client over every replica (its routing, with
  prefix affinity), and dealt in turn to one client per replica (round-robin in
  front of llmbatch), each replica's KV cache too small for every prefix;
- failover: a ``map`` of ``replicas_failover_n`` prompts with one replica killed
  halfway;
- SLO: the ``slo`` scenario's bulk plus realtime streams across every replica.
"""

from __future__ import annotations

import math
import os
from typing import Any

from llmbatch_bench.closedloop.plan import Runner, model_of
from llmbatch_bench.jobs import prefix_prompts, system_prompt

__all__ = [
    "FAILOVER",
    "FLEET",
    "KILLED",
    "ONE",
    "PREFIX_OURS",
    "PREFIX_ROUND_ROBIN",
    "SLO",
    "prefix_sizing",
    "replicas",
]

ONE = "map, 1 replica"
FLEET = "map, all replicas"
PREFIX_OURS = "llmbatch (affinity)"
PREFIX_ROUND_ROBIN = "round-robin (a client per replica)"
FAILOVER = "map, one replica killed"
SLO = "llmbatch, SLO"
#: The replica the failover job kills (not the first: the client's ``base_url``).
KILLED = 1
#: Room for this many times a replica's even share of the prefixes: homes picked by
#: load are not spread exactly evenly.
PREFIX_SLACK = 1.5


def prefix_sizing(
    *,
    prefix_tokens: int,
    prompt_tokens: int,
    max_tokens: int,
    prefixes: int,
    replicas: int,
    max_num_seqs: int,
    block: int = 16,
) -> dict[str, Any]:
    """Each replica's KV cache for the prefix jobs: a full batch of sequences
    (``max_num_seqs``), each holding its own blocks (the prompt past the shared
    prefix's full blocks, plus its output), and beside them the blocks of
    ``PREFIX_SLACK`` times the replica's share of the prefixes.

    Affinity keeps a replica's running batch on about ``prefixes / replicas``
    prefixes, so it runs a full batch with every prefix cached. Round-robin sends
    every prefix to every replica: all of them resident beside a full batch would
    need ``all_prefixes_need`` tokens, 2-4x what there is, so a replica either runs
    fewer sequences (the running ones pin their prefixes) or evicts prefixes it
    needs again soon (and prefills ``prefix_tokens`` again on the next miss).
    """
    shared = prefix_tokens // block  # full blocks a prompt can find cached
    private = -(-(prompt_tokens + max_tokens - shared * block) // block) + 1
    share = math.ceil(prefixes / replicas * PREFIX_SLACK)
    prefix_room = share * shared
    batch = max_num_seqs * private
    return dict(
        kv_tokens=(prefix_room + batch) * block,
        prefix_tokens=prefix_tokens,
        prompt_tokens=prompt_tokens,
        private_blocks=private,
        prefix_room_tokens=prefix_room * block,
        batch_tokens=batch * block,
        all_prefixes_tokens=prefixes * shared * block,
        all_prefixes_need=(prefixes * shared + batch) * block,
        prefixes_over_room=prefixes * shared / prefix_room if prefix_room else math.inf,
    )


def _pinned_vllms(runner: Runner) -> None:
    """With ``--vllm``: one vLLM pinned to one core, then ``replicas`` of them, each
    pinned to a core of its own, under the same per-replica load (bulk only: the
    prefix, failover and SLO jobs need the simulator's knobs)."""
    c = runner.config
    runner.notes.append("replicas with --vllm: each vLLM pinned to a core of its own; bulk only")
    count = min(c.replicas, os.cpu_count() or 1)
    for replicas, label in ((1, ONE), (count, FLEET)):
        n = c.replicas_bulk_n * replicas
        runner.run(
            runner.job(
                kind="replicas",
                scenario="replicas",
                contender="llmbatch",
                label=label,
                workload="uniform",
                replicas=replicas,
                n=n,
                max_tokens=c.max_tokens,
                vllm=(c.vllm_model, c.vllm_args, c.vllm_profile, c.vllm_bin),
                priority_scheduling=None,
                time_limit=120.0 + n / 5,
            )
        )


def replicas(runner: Runner, sim_args: tuple[str, ...] | None) -> None:
    """Every job of the scenario, in order (none with ``--url``: they start their own)."""
    c = runner.config
    if c.vllm_model:
        _pinned_vllms(runner)
        return
    if sim_args is None:
        runner.notes.append("replicas: needs the simulator (it starts several); skipped")
        return
    model = model_of(sim_args, c.max_tokens)
    common: dict[str, Any] = {
        "kind": "replicas",
        "scenario": "replicas",
        "contender": "llmbatch",
        "max_tokens": c.max_tokens,
        "sim_args": sim_args,
        # The library's own choice, as a user of Client([...]) gets it.
        "priority_scheduling": None,
    }
    context = {"model": model.to_json() if model else None}
    for count, label in ((1, ONE), (c.replicas, FLEET)):
        n = c.replicas_bulk_n * count
        runner.run(
            runner.job(
                **common, label=label, workload="uniform", replicas=count, n=n,
                time_limit=120.0 + n / 20,
            ),
            context,
        )  # fmt: skip
    sizing = _sizing(c.replicas_kv_tokens, sim_args, runner)
    prefix_args = (*sim_args, "--kv-cache-tokens", str(sizing["kv_tokens"]))
    for routing, label in (("llmbatch", PREFIX_OURS), ("round_robin", PREFIX_ROUND_ROBIN)):
        runner.run(
            runner.job(
                **{**common, "sim_args": prefix_args},
                label=label,
                workload="prefix",
                routing=routing,
                replicas=c.replicas,
                n=c.replicas_prefix_n,
                prefixes=c.replicas_prefixes,
                prefix_chars=c.replicas_prefix_chars,
                realtime_rate=c.replicas_stream_rate,
                time_limit=120.0 + c.replicas_prefix_n / 20,
            ),
            {**context, "sizing": sizing},
        )
    runner.run(
        runner.job(
            **common, label=FAILOVER, workload="failover", replicas=c.replicas,
            n=c.replicas_failover_n, time_limit=120.0 + c.replicas_failover_n / 20,
        ),
        context,
    )  # fmt: skip
    if c.replicas_slo_duration > 0 and model is not None:
        _slo(runner, common, model, context)


def _sizing(kv_tokens: int | None, sim_args: tuple[str, ...], runner: Runner) -> dict[str, Any]:
    """:func:`prefix_sizing` for the run's prompts, counted as the simulator counts
    them (its built-in estimate); ``kv_tokens`` given overrides the size."""
    from llmbatch_server.sim.counting import EstimateCounter

    c = runner.config
    count = EstimateCounter().count
    model = model_of(sim_args, c.max_tokens)
    systems = [system_prompt(k, c.replicas_prefix_chars) for k in range(c.replicas_prefixes)]
    tokens = [count(s) for s in systems]
    prefix = round(sum(tokens) / len(tokens))
    # The question after the prefix, as the jobs send it.
    first = prefix_prompts(1, c.replicas_prefixes, c.replicas_prefix_chars, c.seed)(0)
    own = next(k for k, s in enumerate(systems) if first.startswith(s))
    sizing = prefix_sizing(
        prefix_tokens=prefix,
        prompt_tokens=prefix + count(first) - tokens[own],
        max_tokens=c.max_tokens,
        prefixes=c.replicas_prefixes,
        replicas=c.replicas,
        max_num_seqs=model.max_num_seqs if model else 256,
    )
    if kv_tokens is not None:
        sizing["kv_tokens"] = kv_tokens
        sizing["given"] = True
    return sizing


def _slo(runner: Runner, common: dict[str, Any], model: Any, context: dict[str, Any]) -> None:
    """As the slo scenario, per replica: realtime at 20/s per replica beside bulk."""
    c = runner.config
    tpot = c.slo_factor * model.idle_token_seconds
    bound = model.bound(tpot)
    full = model.bound(math.inf)
    seconds = c.replicas_slo_warmup + c.replicas_slo_duration
    n = max(1_000, math.ceil(full.prompts_per_s * c.replicas * seconds * 1.5))
    runner.run(
        runner.job(
            **{**common, "priority_scheduling": True},
            label=SLO,
            workload="slo",
            replicas=c.replicas,
            n=n,
            slo_tpot=tpot,
            realtime_rate=20.0 * c.replicas,
            realtime_warmup=c.replicas_slo_warmup,
            realtime_duration=c.replicas_slo_duration,
            time_limit=120.0 + seconds * 2,
        ),
        {
            **context,
            "slo_tpot_s": tpot,
            "idle_token_s": model.idle_token_seconds,
            "slo_factor": c.slo_factor,
            # The step model's best under the SLO, on each replica and on all.
            "bound": bound.to_json() if bound else None,
            "fleet_bound_tokens_per_s": bound.tokens_per_s * c.replicas if bound else None,
        },
    )
