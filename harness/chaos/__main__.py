"""`python -m harness.chaos [--seed N] [--keep]`: harness/chaos/run.py."""

import sys

from harness.chaos.run import main

sys.exit(main())
