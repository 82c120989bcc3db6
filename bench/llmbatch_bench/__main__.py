"""``python -m llmbatch_bench``: ``llmbatch bench`` without the front command."""

import sys

from llmbatch_bench.cli import main

sys.exit(main())
