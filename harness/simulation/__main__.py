"""`python -m harness.simulation --seed N [--minutes M] [--customers K] [--keep] [--lab]` (run.main)."""

import sys

from harness.simulation.run import main

sys.exit(main())
