"""Synthetic CIFAR-shaped images for timing runs only: random 3x32x32 pixels, 10 random classes.

There is nothing to learn (labels are independent of the pixels), so accuracy stays at chance;
what it gives is a model's real compute and gradient sizes without the CIFAR-10 download, for
time-per-iteration tables (VGG-16's). The images are the same on every rank and every run: drawn
from a generator with a fixed seed, ``TRAIN_IMAGES`` for training and ``TEST_IMAGES`` for testing,
held in memory as uint8 (12 MB for the training part).
"""

import torch

from datasets.split import ArrayDataset, DataSplit

TRAIN_IMAGES = 4096
TEST_IMAGES = 512
SEED = 0
_SHAPE = (3, 32, 32)
_CLASSES = 10


def load_cifar10_shaped(data_dir=None):
    """Return the synthetic CIFAR-10-shaped ``DataSplit``; ``data_dir`` is ignored."""
    generator = torch.Generator().manual_seed(SEED)
    images = torch.randint(
        0, 256, (TRAIN_IMAGES + TEST_IMAGES, *_SHAPE), dtype=torch.uint8, generator=generator
    )
    labels = torch.randint(0, _CLASSES, (TRAIN_IMAGES + TEST_IMAGES,), generator=generator)
    mean, std = [0.5] * _SHAPE[0], [0.2887] * _SHAPE[0]  # uniform pixels in [0, 1]: std 1/sqrt(12)
    return DataSplit(
        ArrayDataset(images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES], mean, std),
        ArrayDataset(images[TRAIN_IMAGES:], labels[TRAIN_IMAGES:], mean, std),
        num_classes=_CLASSES,
        input_shape=_SHAPE,
    )
