"""`python -m exchange.stack`: the full stack as `make run` starts it (exchange/stack/run.py)."""

import sys

from exchange.stack.run import main

sys.exit(main())
