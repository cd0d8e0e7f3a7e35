"""Measuring tools for the synchronization methods.

``scripts/bench_allreduce.py`` and ``scripts/simulate.py`` are thin command lines over this package.

The benchmark:

- :mod:`syncbench.gradients`: the gradients every method synchronizes (seeded synthetic ones, or
  a real model's).
- :mod:`syncbench.plan`: which rows to time (each method; SparDL per team count and variant).
- :mod:`syncbench.timing`: one row's synchronizer timed call by call, rows interleaved.
- :mod:`syncbench.floor`: the reference rows, SparDL's messages with no method work.
- :mod:`syncbench.replay`: one rank's share of a call recorded and timed alone.
- :mod:`syncbench.bench`: every row under MPI or replayed, with the network and threads recorded.
- :mod:`syncbench.summary`: rows from per-call records; table, CSV, chart.

The simulator:

- :mod:`syncbench.network`: network models (alpha-beta per rank; one link shared by all ranks).
- :mod:`syncbench.selection_cost`: which selections each rank makes, and what they cost.
- :mod:`syncbench.simulator`: methods recorded on an in-process group and priced at scale.
- :mod:`syncbench.predictions`: the predictions as tables, crossovers and charts.
- :mod:`syncbench.compare`: predictions beside a benchmark's measurements.
- :mod:`syncbench.latency`: the per-message cost of a network, measured under mpiexec.

:mod:`syncbench.cli` holds the command-line checks both scripts share.
"""

#: The package's surface is its modules, each with its own ``__all__``.
__all__: list[str] = []
