"""The benchmarks: each module is one, run from the project root as `.venv/bin/python -m bench.NAME`
(`make bench` runs them all); bench/_bench.py is what they share beyond the harness (harness)."""
