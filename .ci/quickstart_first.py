"""Run the first python block of docs/quickstart.md as a user would, on a given port.

The block is written for a server at 127.0.0.1:8000; the port is replaced so that CI
never depends on 8000 being free. Waits for the server's /health first.
Usage: python quickstart_first.py QUICKSTART.md PORT
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def main(page: str, port: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", Path(page).read_text(), flags=re.S)
    program = blocks[0].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"no simulator on port {port} after 60 s") from None
            time.sleep(0.2)
    Path("hello.py").write_text(program)
    subprocess.run([sys.executable, "hello.py"], check=True, timeout=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
