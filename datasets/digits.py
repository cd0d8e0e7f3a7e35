"""scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), shipped with the package.

A fixed stratified split keeps 20% (360 images) for testing.
"""

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from datasets.split import ArrayDataset, DataSplit

_MAX_PIXEL = 16.0  # pixel values are integers 0..16


def load(data_dir=None):
    """Return the digits ``DataSplit``; ``data_dir`` is ignored."""
    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / _MAX_PIXEL
    labels = torch.tensor(bunch.target)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.2, random_state=0, stratify=labels
    )
    mean, std = [train_x.mean().item()], [train_x.std().item()]
    return DataSplit(
        ArrayDataset(train_x, train_y, mean, std),
        ArrayDataset(test_x, test_y, mean, std),
        num_classes=10,
        input_shape=(1, 8, 8),
    )
