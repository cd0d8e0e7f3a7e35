"""Shared pieces of the loaders: the result record, the error type, in-memory image sets."""

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


class DataError(Exception):
    """Data files are missing or unreadable; the message says what to put where."""


@dataclass
class DataSplit:
    """A data set's train and test parts with what a model needs to know about them."""

    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple  # (channels, height, width) of one image


def check_labels(labels, num_classes, source):
    """``DataError`` naming ``source`` unless every label lies in ``0 .. num_classes-1``."""
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise DataError(
            f"{source}: labels range over {int(labels.min())}..{int(labels.max())}, "
            f"outside the {num_classes} classes 0..{num_classes - 1} (damaged?)"
        )


class ArrayDataset(Dataset):
    """Images and labels held in memory as tensors.

    ``images`` is (N, C, H, W), uint8 (scaled to [0, 1] on access) or float (used as is);
    ``mean`` and ``std`` (one value per channel) normalise every image; ``augment``, if given,
    is applied to each uint8 image before normalisation.
    """

    def __init__(self, images, labels, mean, std, augment=None):
        self.images = images
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment = augment

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        if self.augment is not None:
            image = self.augment(image)
        if image.dtype == torch.uint8:
            image = image.float().div_(255)
        return (image - self.mean) / self.std, self.labels[index]
