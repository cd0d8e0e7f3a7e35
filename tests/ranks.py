"""Helpers for tests that play several ranks in one process."""

import importlib
import os

import numpy as np
import torch

import compressors
from allreducers.transports import local_group

#: Comma-separated modules to import before the tests run: methods registered outside the
#: repository then join the tests parametrized over ``compressors.available()``.
EXTRA_METHODS = "SPARDL_TEST_METHODS"


def import_extra_methods() -> list:
    """Import the modules named in ``$SPARDL_TEST_METHODS`` (their ``@register`` adds their
    methods); return their names."""
    names = [name.strip() for name in os.environ.get(EXTRA_METHODS, "").split(",") if name.strip()]
    for name in names:
        importlib.import_module(name)
    return names


def measuring(method: str, options: dict = None) -> dict:
    """``options`` plus ``measure_loss=True`` for a method that measures its lost mass on request
    (gTop-k), so that its mass can be checked against what it says it lost."""
    options = dict(options or {})
    if "measure_loss" in compressors.options(method):
        options.setdefault("measure_loss", True)
    return options


def heavy_tailed(shape, seed):
    """Float32 Student-t values: gradient-like, with a few large entries."""
    return torch.from_numpy(np.random.default_rng(seed).standard_t(3, shape).astype(np.float32))


def run_calls(method, workers, numel, density, calls=1, seed=0, grads=None, **options):
    """Create ``method`` on ``workers`` in-process ranks and run ``calls`` synchronizations of
    ``grads`` (calls, workers, numel); heavy-tailed ones from ``seed`` by default.

    Returns per call: the gradients (workers, numel), residuals before and after, the results and
    the stats of every rank, and the synchronizers' final state dicts.
    """
    if grads is None:
        grads = heavy_tailed((calls, workers, numel), seed)

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        history = []
        for call in range(calls):
            before = sync.residual.clone()
            result = sync.allreduce(grads[call, transport.rank].clone())
            history.append((before, result, sync.residual.clone(), dict(sync.stats)))
        return history, sync.state_dict()

    per_rank = local_group(workers).run(body)
    out = []
    for call in range(calls):
        out.append(
            {
                "grads": grads[call],
                "before": torch.stack([h[call][0] for h, _ in per_rank]),
                "results": [h[call][1] for h, _ in per_rank],
                "after": torch.stack([h[call][2] for h, _ in per_rank]),
                "stats": [h[call][3] for h, _ in per_rank],
            }
        )
    return out, [state for _, state in per_rank]


def mass_error(call, workers):
    """max |sum_r(grad_r + res_before_r) - (P*avg + sum_r res_after_r)|, and the sums' scale."""
    lhs = (call["grads"].double() + call["before"].double()).sum(0)
    rhs = workers * call["results"][0].double() + call["after"].double().sum(0)
    return float((lhs - rhs).abs().max()), float(lhs.abs().max()) + 1.0
