"""Every ``python`` block of README.md and docs/*.md runs as written.

Each block is saved as a program and run in a process of its own, from an empty
directory, against a simulator started the way its page says: with the arguments of
the page's first ``llmbatch-server sim ...`` command line (plain ``llmbatch-server
sim`` where it shows none), on a free port in place of 8000. The docs' address,
``http://127.0.0.1:8000/v1``, is pointed at that port, and ``LLMBATCH_BASE_URL``
names it for blocks that rely on the environment.

One convention marks what is not a whole program, on the line before the block:

- ``<!-- fragment -->``: part of a program (an ``await`` outside a function, a
  ``...`` standing for the reader's code, addresses of the reader's servers), not
  run. The README and the quickstart have none.
- ``<!-- needs: redis -->`` / ``<!-- needs: ray -->``: runs where that is installed
  (CI's test stage has a redis-server; its ray stage installs Ray), else skipped
  with the reason.

The runs are marked ``docs`` and left out of the default test run (~1 min); CI runs
them as a stage of their own: ``pytest -m docs tests/docs``. The checks of the marks
run by default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmbatch_server.testing import SimulatorProcess, run_simulator

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS_URL = "http://127.0.0.1:8000/v1"
#: A block's run must end within this (the quickstart's together in under 30 s).
BLOCK_TIMEOUT = 60.0
MARK = re.compile(r"<!--\s*(fragment|needs:\s*(\w+))\s*-->")
SIM_LINE = re.compile(r"llmbatch-server sim\b([^\n#`]*)")


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    fragment: bool
    needs: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    """The page's python blocks, with the mark on the line before each (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        mark = MARK.search(lines[i - 1]) if i else None
        yield Block(
            page,
            i + 1,
            "\n".join(lines[i + 1 : end]) + "\n",
            fragment=bool(mark and mark.group(1) == "fragment"),
            needs=mark.group(2) if mark else None,
        )


ALL = [block for page in PAGES for block in blocks(page)]


def sim_args(page: Path) -> tuple[str, ...]:
    """The arguments the page starts its simulator with: its first ``llmbatch-server
    sim`` command in a shell block (not one quoted in prose or a table)."""
    found = None
    shell = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            shell = line.strip() in ("```bash", "```console", "```sh")
        elif shell and (found := SIM_LINE.search(line)):
            break
    args = shlex.split(found.group(1)) if found else []
    # The port is ours to choose; --host stays loopback.
    cleaned: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--port", "--host"):
            skip = True
        elif not arg.startswith(("--port=", "--host=")):
            cleaned.append(arg)
    return tuple(cleaned)


@pytest.fixture(scope="module")
def simulator() -> Iterator[Callable[[tuple[str, ...]], SimulatorProcess]]:
    """A simulator per distinct set of page arguments, started on first need and
    stopped when the module's blocks are done."""
    started: dict[tuple[str, ...], SimulatorProcess] = {}
    with contextlib.ExitStack() as stack:

        def get(args: tuple[str, ...]) -> SimulatorProcess:
            if args not in started:
                started[args] = stack.enter_context(run_simulator(*args))
            return started[args]

        yield get


def _skip_reason(block: Block) -> str | None:
    if block.fragment:
        return "marked <!-- fragment -->: part of a program, not run"
    if block.needs == "redis" and shutil.which("redis-server") is None:
        return "needs a redis-server (CI's test stage installs one)"
    if block.needs == "ray" and importlib.util.find_spec("ray") is None:
        return "needs Ray: pip install 'llmbatch[ray]' (CI's ray stage)"
    return None


@pytest.mark.docs
@pytest.mark.parametrize("block", ALL, ids=[block.id for block in ALL])
def test_block_runs_as_written(
    block: Block,
    simulator: Callable[[tuple[str, ...]], SimulatorProcess],
    tmp_path: Path,
) -> None:
    reason = _skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    sim = simulator(sim_args(block.page))
    program = tmp_path / "block.py"
    program.write_text(block.code.replace(DOCS_URL, sim.base_url), encoding="utf-8")
    env = {**os.environ, "LLMBATCH_BASE_URL": sim.base_url}
    env.pop("OPENAI_BASE_URL", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, (
        f"{block.id} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    print(f"{block.id}: ran in {took:.1f} s")


def test_the_readme_and_the_quickstart_have_no_fragments() -> None:
    for name in ("README.md", "docs/quickstart.md"):
        marked = [b.id for b in blocks(ROOT / name) if b.fragment or b.needs]
        assert not marked, marked


def test_every_block_is_a_program_or_marked() -> None:
    # A block with a top-level await or async with cannot run as a program: it must
    # be marked a fragment (and the check above keeps such blocks out of the README
    # and the quickstart).
    for block in ALL:
        top_level_await = re.search(r"^(await |async (with|for) )", block.code, re.MULTILINE)
        if top_level_await:
            assert block.fragment, f"{block.id} awaits at top level but is not a fragment"
