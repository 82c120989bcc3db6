"""``llmbatch-server fit``: measure a running engine, so the simulator can serve like it.

``model`` is the fit itself (pure: points in, step model out, the JSON file);
``measure`` sends the probes; ``cli`` is the command.
"""

from llmbatch_server.fit.model import Fit, FittedLimits, FittedStep, load_fit

__all__ = ["Fit", "FittedLimits", "FittedStep", "load_fit"]
