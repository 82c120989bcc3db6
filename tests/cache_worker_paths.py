"""Where the shared-cache worker program is (for the tests that run it)."""

from pathlib import Path

WORKER = Path(__file__).resolve().parent / "cache_worker.py"
