"""`python -m exchange.stack.simulation --seed N [--minutes M] [--customers K] [--keep]`."""

import sys

from exchange.stack.simulation.run import main

sys.exit(main())
