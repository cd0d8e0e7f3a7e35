"""Paper-style tables and plots from the ``metrics.jsonl`` of training runs (``scripts/report.py``).

``runs`` reads a run's rows, ``settings`` groups and labels runs by what they were run with,
``tables`` writes the Markdown tables, ``plots`` the figures and ``cli`` is the command line.
"""

#: The package's surface is its modules, each with its own ``__all__``.
__all__: list[str] = []
