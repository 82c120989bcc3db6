"""The engine's own ceiling: vLLM's offline ``LLM.generate`` with the engine
arguments ``vllm serve`` gets, the yardstick of ``llmbatch bench --vllm MODEL
--scenario ceiling``.

The offline run goes first, in the vLLM installation's own Python (its
``EngineArgs`` parse the very flags ``vllm serve`` would get: the launcher's profile
plus the extra ones), timed around ``LLM.generate`` alone, with the CPU of that
process and its children (the engine core) over the same span. Then the harness
starts ``vllm serve`` with those flags and runs each client's bulk work on prompts
of its own (no prefix-cache gifts); the report gives each as a share of this run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmbatch_bench.config import BenchConfig
from llmbatch_bench.jobs import prompts

__all__ = ["OFFLINE_PROMPT_START", "measure", "offline_argv", "offline_ceiling", "python_of"]

#: The offline run's prompts are numbered from here, apart from the HTTP runs'.
OFFLINE_PROMPT_START = 50_000_000

#: Run by the vLLM installation's Python: parse ``vllm serve``'s flags into its own
#: EngineArgs, build an LLM from them, and time one ``generate`` of the prompts.
_OFFLINE = r"""
import dataclasses, json, sys, time
import psutil
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
me = psutil.Process()
def cpu(process):
    times = process.cpu_times()
    return times.user + times.system
engines = me.children(recursive=True)
before = (cpu(me), sum(cpu(p) for p in engines))
started = time.perf_counter()
outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
seconds = time.perf_counter() - started
after = (cpu(me), sum(cpu(p) for p in engines))
tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
result = {
    "seconds": seconds, "prompts": len(outputs), "output_tokens": tokens,
    # The LLM's own process (scheduling, detokenizing) and its engine core's.
    "front_cpu_s": after[0] - before[0], "engine_cpu_s": after[1] - before[1],
}
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


def python_of(vllm_bin: str | None) -> str:
    """The Python beside a ``vllm`` executable (its installation's; ``vllm`` on PATH
    when None)."""
    found = shutil.which(vllm_bin or "vllm")
    if found is None:
        raise RuntimeError(f"the ceiling scenario cannot find {vllm_bin or 'vllm'!r}")
    candidate = Path(found).resolve().parent / "python"
    return str(candidate) if candidate.exists() else sys.executable


def measure(config: BenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    """The offline run of ``config``: ``config.n`` prompts of its shape (numbered
    apart from every HTTP run's), ``config.max_tokens`` each."""
    if config.vllm_model is None:
        raise ValueError("the ceiling scenario runs vLLM's offline engine: it needs --vllm MODEL")
    argv = offline_argv(config.vllm_model, config.vllm_profile, config.vllm_args)
    progress(f"ceiling: LLM.generate of {config.n} prompts, LLM(**EngineArgs({' '.join(argv)}))")
    texts = list(prompts(config.n, start=OFFLINE_PROMPT_START))
    result = offline_ceiling(python_of(config.vllm_bin), argv, texts, config.max_tokens)
    result.update(engine_argv=argv, prompt_shape=config.prompts)
    progress(
        f"ceiling: {result['prompts_per_s']:.1f} prompts/s, "
        f"{result['output_tokens_per_s']:.0f} output tokens/s offline"
    )
    return result
