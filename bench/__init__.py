"""The benchmarks: each module is one, run from the project root as `.venv/bin/python -m bench.NAME`
(`make bench` runs them all); bench/_bench.py is what they share beyond the harness (harness).
The programs a bench runs in processes of their own (its accounts' setup, posters, the in-process
timings, the websocket counter) are modules in bench/programs/, one each, with a `main(argv)`, run
as `python -m bench.programs.NAME ARGS`, never `python -c` strings, so ruff and
tests/test_dependencies.py read them."""
