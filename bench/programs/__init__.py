"""The programs the benchmarks run in processes of their own, one module each, run as
`python -m bench.programs.NAME ARGS` (bench/_bench.PYTHON, the project root as cwd): each has a
`main(argv)`, and its docstring says its arguments and what it prints."""
