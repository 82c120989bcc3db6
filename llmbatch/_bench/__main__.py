"""``python -m llmbatch._bench``: ``llmbatch bench`` without the front command."""

import sys

from llmbatch._bench.cli import main

sys.exit(main())
