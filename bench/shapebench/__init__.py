"""The static-shape benchmark harness behind `bench/static_shapes.py` (see docs/benchmarks.md).

Each variant of a table trains in a fresh process (`child.py`), so max RSS and compile counters
start from zero; the harness (`runner.py`) plans the runs, reads back their metrics
(`results.py`) and prints the tables (`tables.py`).
"""
