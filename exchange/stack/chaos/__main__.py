"""`python -m exchange.stack.chaos [--seed N] [--keep]`: exchange/stack/chaos/run.py."""

import sys

from exchange.stack.chaos.run import main

sys.exit(main())
