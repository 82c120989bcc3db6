"""``llmbatch-bench`` (also ``llmbatch bench``): llmbatch side by side with the clients
people use today, and with the leanest client that sends the same requests.

A run (:mod:`llmbatch_bench.harness`) plans jobs (:mod:`llmbatch_bench.jobs`): the
server scenarios drive contenders (:mod:`llmbatch_bench.scenarios`: llmbatch and
the baselines of :mod:`llmbatch_bench.baselines`) against any OpenAI-compatible
server or the simulator; the hot-path scenarios (:mod:`llmbatch_bench.hotplan`)
measure llmbatch's public calls (:mod:`llmbatch_bench.hotpath`) beside their
references (:mod:`llmbatch_bench.references`) against a zero-latency simulator.
Every measurement runs in its own child process (:mod:`llmbatch_bench.worker`), so
client CPU and peak RSS belong to that client alone. The report
(:mod:`llmbatch_bench.report`, :mod:`llmbatch_bench.targets`) states each target,
the measured value and whether it was met: the thresholds live here, never in the
library.
"""

__version__ = "0.2.0"
"""The installed llmbatch-bench version (PEP 440); the build reads it from here too."""
