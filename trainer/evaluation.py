"""Test-set evaluation split across ranks, with numbers every rank agrees on."""
import torch
from torch.nn import functional

from trainer.distributed import sum_over_ranks


def evaluate(model, loader, device, comm):
    """Return (mean loss, accuracy) of ``model`` over the union of every rank's ``loader``.

    Each rank's loader covers its own disjoint part of the test set (see
    ``trainer.sampler.evaluation_shard``); sums are combined over ranks, so every rank returns
    the same two numbers. The model is left in training mode.
    """
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss_sum += functional.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            count += labels.numel()
    model.train()
    loss_sum, correct, count = sum_over_ranks(comm, [loss_sum, correct, count])
    return loss_sum / count, correct / count
