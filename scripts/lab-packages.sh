#!/usr/bin/env bash
# The HA lab's Debian packages (docs/scaling.md, `make lab-test`): the test run's (scripts/packages/test.txt)
# and the lab's own (scripts/packages/lab.txt), installed when missing, their services kept from
# starting (scripts/install-packages.sh).
set -euo pipefail
here=$(dirname "$0")
exec "$here/install-packages.sh" "$here/packages/test.txt" "$here/packages/lab.txt"
