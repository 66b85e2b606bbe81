"""`python -m harness.simulation --seed N [--minutes M] [--customers K] [--keep]`."""

import sys

from harness.simulation.run import main

sys.exit(main())
