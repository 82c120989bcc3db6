"""``llmbatch bench``: llmbatch side by side with the clients people use today.

Scenarios (:mod:`llmbatch_bench.scenarios`) drive contenders
(:mod:`llmbatch_bench.contenders`: llmbatch itself, and the baselines in
:mod:`llmbatch_bench.baselines`) against any OpenAI-compatible server, or against
the simulator the harness starts itself. Every measured run happens in its own
child process (:mod:`llmbatch_bench.worker`), so client CPU and peak RSS belong to
that client alone: the server, the harness and the other clients are elsewhere.
"""
