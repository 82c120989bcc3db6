"""``python -m llmbatch_bench.experiments.hosted``: the hosted limiter's experiment,
where the earlier runs' commands name it (:mod:`llmbatch_bench.hosted` holds it, so
the bench's ``hosted`` scenario can use it too)."""

from __future__ import annotations

from llmbatch_bench.hosted import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
