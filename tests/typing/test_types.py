"""What a type checker sees of the public API (mypy on tests/typing/*.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_the_answer_type_follows_the_response_model() -> None:
    source = HERE / "structured_calls.py"
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = run.stdout.splitlines()
    revealed = [
        re.sub(r"\w+\.", "", line.split('Revealed type is "')[1].rstrip('"'))
        for line in lines
        if "Revealed type is" in line
    ]
    assert revealed == [
        "P",
        "None",
        "P | None",
        "list[P]",
        "Any",
        "P | None",
        "list[Result[P]]",
    ], run.stdout
    errors = [line for line in lines if ": error:" in line]
    assert any('did you mean "max_tokens"' in line for line in errors), run.stdout
