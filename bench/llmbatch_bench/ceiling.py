"""The engine's own ceiling: vLLM's offline ``LLM.generate`` with the same engine
arguments and prompts, beside llmbatch and the baselines over HTTP.

    python -m llmbatch_bench.ceiling --model DIR --vllm-bin VENV/bin/vllm \\
        --prompts short --n 2000 [-- extra vllm serve flags]

First the offline run, in the vLLM installation's own Python (its ``EngineArgs``
parse the very flags ``vllm serve`` would get: the launcher's profile plus the
extra ones), timed around ``LLM.generate`` alone; then ``vllm serve`` with those
flags, and a bulk run of each client on prompts of its own (no prefix-cache
gifts). Every client's prompts/s and output tokens/s are printed as a share of
the offline run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmbatch_bench.jobs import PROMPTS_ENV, prompts

__all__ = ["main", "offline_argv", "offline_ceiling"]

#: Run by the vLLM installation's Python: parse ``vllm serve``'s flags into its own
#: EngineArgs, build an LLM from them, and time one ``generate`` of the prompts.
_OFFLINE = r"""
import dataclasses, json, sys, time
spec = json.load(sys.stdin)
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older releases
    from vllm.utils import FlexibleArgumentParser
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
engine = EngineArgs.from_cli_args(parser.parse_args(spec["argv"]))
llm = LLM(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})
params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True)
llm.generate(spec["warmup"], params, use_tqdm=False)
started = time.perf_counter()
outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
seconds = time.perf_counter() - started
tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
result = {"seconds": seconds, "prompts": len(outputs), "output_tokens": tokens}
print("CEILING " + json.dumps(result))
"""

#: ``vllm serve`` flags that say where to listen, not how the engine runs.
_SERVING_ONLY = frozenset({"--host", "--port", "--api-key"})


def offline_argv(model: str, profile: str, extra: Sequence[str]) -> list[str]:
    """The engine flags ``vllm serve`` gets from the launcher (profile and extra),
    as ``EngineArgs`` parse them: the model first, serving-only flags dropped."""
    from llmbatch_server.launcher.profiles import build_argv

    argv = build_argv(model=model, profile=profile, extra=list(extra))[3:]  # vllm serve MODEL
    kept: list[str] = ["--model", model]
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _SERVING_ONLY:
            skip = "=" not in arg and i + 1 < len(argv)
            continue
        kept.append(arg)
    return kept


def offline_ceiling(
    vllm_python: str,
    argv: Sequence[str],
    texts: Sequence[str],
    max_tokens: int,
    *,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """``LLM.generate`` of ``texts`` in the vLLM installation's Python: seconds,
    prompts, output tokens, prompts/s and output tokens/s."""
    spec = {
        "argv": list(argv),
        "prompts": list(texts),
        "warmup": list(texts[:8]) if len(texts) > 8 else list(texts),
        "max_tokens": max_tokens,
    }
    done = subprocess.run(
        [vllm_python, "-c", _OFFLINE],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )
    if done.returncode != 0:
        raise RuntimeError(f"offline LLM.generate failed:\n{done.stderr[-3000:]}")
    # (vLLM logs to stdout too: the result is the marked line.)
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("CEILING "))
    result: dict[str, Any] = json.loads(line[len("CEILING ") :])
    result["prompts_per_s"] = result["prompts"] / result["seconds"]
    result["output_tokens_per_s"] = result["output_tokens"] / result["seconds"]
    return result


def _python_of(vllm_bin: str) -> str:
    """The Python beside a ``vllm`` executable (its installation's)."""
    candidate = Path(vllm_bin).resolve().parent / "python"
    return str(candidate) if candidate.exists() else sys.executable


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(prog="python -m llmbatch_bench.ceiling", description=__doc__)
    p.add_argument("--model", required=True, help="the model directory or name")
    p.add_argument("--vllm-bin", default="vllm", help="the vllm executable (default: vllm)")
    p.add_argument("--profile", default="latency", help="the launcher's profile")
    p.add_argument("--prompts", default="short", help="short, standard, long or mixed")
    p.add_argument("--n", type=int, default=2000, help="prompts a run (default: 2000)")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens a prompt (default: 4)")
    p.add_argument("--clients", default="llmbatch,aiohttp,openai", help="clients over HTTP")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    os.environ[PROMPTS_ENV] = args.prompts
    texts = list(prompts(args.n, start=50_000_000))  # the HTTP runs use their own
    engine_argv = offline_argv(args.model, args.profile, extra)
    print(f"offline: LLM(**EngineArgs({' '.join(engine_argv)}))", file=sys.stderr)
    ceiling = offline_ceiling(_python_of(args.vllm_bin), engine_argv, texts, args.max_tokens)
    print(
        f"offline LLM.generate: {ceiling['prompts_per_s']:.1f} prompts/s, "
        f"{ceiling['output_tokens_per_s']:.0f} output tokens/s"
    )
    report_path = Path(tempfile.mkdtemp()) / "bulk.json"
    bench = [
        sys.executable, "-m", "llmbatch_bench", "--vllm", args.model, "--vllm-bin", args.vllm_bin,
        "--vllm-profile", args.profile, "--scenario", "bulk", "--prompts", args.prompts,
        "--n", str(args.n), "--max-tokens", str(args.max_tokens), "--clients", args.clients,
        "--concurrency", "64", "--quiet", "--json", str(report_path),
    ]  # fmt: skip
    if extra:
        bench += ["--", *extra]
    run = subprocess.run(bench, capture_output=True, text=True, timeout=1800, check=False)
    if run.returncode != 0:
        print(run.stderr[-3000:], file=sys.stderr)
        return run.returncode
    report = json.loads(report_path.read_text())
    rows = []
    for summary in report["summaries"]:
        share = summary["prompts_per_s"] / ceiling["prompts_per_s"]
        rows.append(
            {
                "client": summary["label"],
                "prompts_per_s": summary["prompts_per_s"],
                "of_ceiling": share,
            }
        )
        print(
            f"{summary['label']:9s} {summary['prompts_per_s']:8.1f} prompts/s "
            f"= {share:.2f}x the ceiling"
        )
    if args.json:
        out = {"ceiling": ceiling, "engine_argv": engine_argv, "clients": rows, "bench": report}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
