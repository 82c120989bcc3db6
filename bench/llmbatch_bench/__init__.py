"""``llmbatch-bench`` (also ``llmbatch bench``): llmbatch side by side with the clients
people use today, and with the leanest client that sends the same requests.

A run (:mod:`.harness`) plans jobs (:mod:`.jobs`): the
server scenarios drive contenders (:mod:`.scenarios`: llmbatch and
the baselines of :mod:`.baselines`) against any OpenAI-compatible
server or the simulator; the hot-path scenarios (:mod:`.hotpath.plan`)
measure llmbatch's public calls (:mod:`.hotpath.steady`) beside their
references (:mod:`.hotpath.references`) against a zero-latency simulator.
Every measurement runs in its own child process (:mod:`.worker`), so
client CPU and peak RSS belong to that client alone. The report
(:mod:`.report`, :mod:`.targets`) states each target,
the measured value and whether it was met: the thresholds live here, never in the
library.
"""

__version__ = "0.3.0"
"""The installed llmbatch-bench version (PEP 440); the build reads it from here too."""
