import sys

from llmbatch._cli import main

sys.exit(main())
