import sys

from llmbatch_server.cli import main

sys.exit(main())
