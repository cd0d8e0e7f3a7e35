"""Measuring tools for the synchronization methods: the benchmark's gradient sources, its timed
runs and floor rows, the record/replay harness, and the alpha-beta simulator with its network
models. ``scripts/bench_allreduce.py`` and ``scripts/simulate.py`` are thin command lines over
this package."""
