"""The loss a model trains on, and test-set evaluation split across ranks, with numbers every
rank agrees on."""

import torch
from torch.nn import functional

from trainer.distributed import sum_over_ranks

#: A label that is not predicted (a masked language model's unmasked tokens).
IGNORE = -100


def prediction_loss(output, labels, reduction="mean"):
    """Cross-entropy of ``output`` against ``labels``, over the predictions that count.

    A classifier's ``(B, classes)`` scores with ``(B,)`` labels, or a masked language model's
    ``(B, L, vocab)`` scores with ``(B, L)`` labels, where only positions whose label is not
    ``IGNORE`` count. (Cross-entropy of log-probabilities equals their negative log-likelihood,
    so a model ending in log-softmax trains on the same loss.)
    """
    return functional.cross_entropy(
        output.flatten(0, -2), labels.flatten(), reduction=reduction, ignore_index=IGNORE
    )


def predictions(labels):
    """The number of predictions ``labels`` asks for (labels that are not ``IGNORE``)."""
    return int((labels != IGNORE).sum())


def evaluate(model, loader, device, comm):
    """Return (mean loss, accuracy) of ``model`` over the union of every rank's ``loader``.

    Each rank's loader covers its own disjoint part of the test set (see
    ``trainer.sampler.evaluation_shard``); sums are combined over ranks, so every rank returns
    the same two numbers. Both are per prediction: per sample for a classifier, per masked
    token for a masked language model. The model is left in training mode.
    """
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            output = model(inputs)
            loss_sum += prediction_loss(output, labels, reduction="sum").item()
            correct += (output.argmax(dim=-1) == labels).sum().item()
            count += predictions(labels)
    model.train()
    loss_sum, correct, count = sum_over_ranks(comm, [loss_sum, correct, count])
    return loss_sum / count, correct / count
