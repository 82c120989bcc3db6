"""A vLLM-compatible simulator: vLLM's HTTP API over a model of its engine.

Run it with ``llmbatch-server sim``; embed it with :func:`build_app`; start it as
a subprocess for tests and demos with :func:`llmbatch_server.testing.run_simulator`.
"""

from llmbatch_server.sim.app import build_app
from llmbatch_server.sim.config import EngineLimits, FaultRates, SimConfig, StepModel

__all__ = ["EngineLimits", "FaultRates", "SimConfig", "StepModel", "build_app"]
