"""`python -m harness`: the full stack as `make run` starts it (harness/run.py)."""

import sys

from harness.run import main

sys.exit(main())
