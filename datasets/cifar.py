"""CIFAR-10 and CIFAR-100 (32x32 colour images) in the python pickle format of their archives.

``DATA_DIR/cifar-10-batches-py/{data_batch_1..5,test_batch}`` and
``DATA_DIR/cifar-100-python/{train,test}``, exactly as the official archives (and torchvision's
download) extract. Training images get the usual augmentation: random crop with 4 pixels of
padding and a random horizontal flip.
"""

import pickle
from pathlib import Path

import numpy as np
import torch
import torchvision
from torchvision.transforms import v2

from datasets.split import ArrayDataset, DataError, DataSplit, check_labels

_CIFAR10_FOLDER = "cifar-10-batches-py"
_CIFAR10_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_CIFAR100_FOLDER = "cifar-100-python"
_MEAN = {10: [0.4914, 0.4822, 0.4465], 100: [0.5071, 0.4865, 0.4409]}
_STD = {10: [0.2470, 0.2435, 0.2616], 100: [0.2673, 0.2564, 0.2762]}


def load_cifar10(data_dir):
    """Return the CIFAR-10 ``DataSplit`` from ``data_dir/cifar-10-batches-py``."""
    folder = Path(data_dir) / _CIFAR10_FOLDER
    _require(folder, _CIFAR10_TRAIN + ["test_batch"], "CIFAR-10", "cifar-10-python.tar.gz")
    return _split(folder, _CIFAR10_TRAIN, ["test_batch"], b"labels", 10)


def load_cifar100(data_dir):
    """Return the CIFAR-100 ``DataSplit`` (fine labels) from ``data_dir/cifar-100-python``."""
    folder = Path(data_dir) / _CIFAR100_FOLDER
    _require(folder, ["train", "test"], "CIFAR-100", "cifar-100-python.tar.gz")
    return _split(folder, ["train"], ["test"], b"fine_labels", 100)


def download_cifar10(data_dir):
    """Download and extract CIFAR-10 into ``data_dir`` with torchvision."""
    torchvision.datasets.CIFAR10(data_dir, download=True)


def download_cifar100(data_dir):
    """Download and extract CIFAR-100 into ``data_dir`` with torchvision."""
    torchvision.datasets.CIFAR100(data_dir, download=True)


def read_batches(folder, names, label_key, num_classes):
    """Read pickled batches into (uint8 images of shape (N, 3, 32, 32), int64 labels), the labels
    checked to lie in ``0 .. num_classes-1``."""
    images, labels = [], []
    for name in names:
        try:
            with open(folder / name, "rb") as stream:
                batch = pickle.load(stream, encoding="bytes")
            batch = {
                key.encode() if isinstance(key, str) else key: value  # re-saved with str keys
                for key, value in batch.items()
            }
            data, batch_labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key])
        except Exception as error:  # noqa: BLE001 - whatever a damaged pickle raises: one message
            raise DataError(
                f"{folder / name} is not a CIFAR batch (truncated or damaged?): "
                f"{type(error).__name__}: {error}"
            ) from None
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(
                f"{folder / name}: its data is {data.dtype} of shape {data.shape}, not a CIFAR "
                "batch's uint8 rows of 3072 values (each image's red, green, blue 32x32 planes)"
            )
        if batch_labels.ndim != 1 or not np.issubdtype(batch_labels.dtype, np.integer):
            raise DataError(
                f"{folder / name}: its labels are {batch_labels.dtype} of shape "
                f"{batch_labels.shape}, not a list of integers"
            )
        if len(batch_labels) != len(data):
            raise DataError(f"{folder / name}: {len(data)} images but {len(batch_labels)} labels")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.extend(batch_labels.tolist())
    labels = torch.tensor(labels, dtype=torch.int64)
    check_labels(labels, num_classes, f"{folder} {', '.join(names)}")
    return torch.from_numpy(np.concatenate(images)), labels


def _split(folder, train_names, test_names, label_key, num_classes):
    augment = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    mean, std = _MEAN[num_classes], _STD[num_classes]
    train = ArrayDataset(
        *read_batches(folder, train_names, label_key, num_classes), mean, std, augment
    )
    test = ArrayDataset(*read_batches(folder, test_names, label_key, num_classes), mean, std)
    return DataSplit(train, test, num_classes=num_classes, input_shape=(3, 32, 32))


def _require(folder, names, title, archive):
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise DataError(
            f"{title} not found: {folder} lacks {', '.join(missing)}; extract {archive} from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html into {folder.parent} "
            f"(it creates {folder.name}/), or pass --download when online"
        )
