"""Server side of llmbatch: a vLLM launcher and a vLLM-compatible simulator.

This package is never imported by the ``llmbatch`` client library.
"""

__version__ = "0.3.0"
