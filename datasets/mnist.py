"""MNIST and Fashion-MNIST (28x28 grey images, 10 classes) from IDX files.

The image size is read from the files (train and test must agree), labels must lie in 0..9.

Looked for, in order, in ``DATA_DIR/MNIST/raw`` (or ``DATA_DIR/FashionMNIST/raw``,
torchvision's layout), for Fashion-MNIST then in the Debian package's location
``/usr/share/datasets/fashion-mnist`` (``apt-get install dataset-fashion-mnist``), and last in
``DATA_DIR`` itself (both data sets use the same file names, so there the files are taken as
whichever was asked for). Each file may be gzipped (``.gz``) or not.
"""

import gzip
from pathlib import Path

import numpy as np
import torch
import torchvision

from datasets.split import ArrayDataset, DataError, DataSplit, check_labels

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
_IDX_UINT8 = 0x08
_CLASSES = 10


def load_mnist(data_dir):
    """Return the MNIST ``DataSplit`` found under ``data_dir``."""
    return _load(
        "MNIST", [Path(data_dir) / "MNIST" / "raw", Path(data_dir)], mean=0.1307, std=0.3081
    )


def load_fashion_mnist(data_dir):
    """Return the Fashion-MNIST ``DataSplit`` found under ``data_dir`` or Debian's location."""
    return _load(
        "FashionMNIST",
        [Path(data_dir) / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST, Path(data_dir)],
        mean=0.2860,
        std=0.3530,
    )


def download_mnist(data_dir):
    """Download MNIST into ``data_dir/MNIST/raw`` with torchvision."""
    torchvision.datasets.MNIST(data_dir, download=True)


def download_fashion_mnist(data_dir):
    """Download Fashion-MNIST into ``data_dir/FashionMNIST/raw`` with torchvision."""
    torchvision.datasets.FashionMNIST(data_dir, download=True)


def read_idx(path):
    """Read an IDX file of unsigned bytes (gzipped or not) into a uint8 numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError) as error:  # a broken or truncated gzip stream
        raise DataError(f"{path} cannot be read: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UINT8:
        raise DataError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != 4 + 4 * ndim + int(np.prod(shape)):
        raise DataError(
            f"{path} holds {len(raw) - 4 - 4 * ndim} bytes of data, its header "
            f"announces {int(np.prod(shape))} (shape {shape}): truncated or damaged"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _load(folder, directories, mean, std):
    files = _find_files(folder, directories)
    arrays = {key: torch.from_numpy(read_idx(path).copy()) for key, path in files.items()}
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise DataError(
                f"{files[f'{part}_images']} ({tuple(images.shape)}) and "
                f"{files[f'{part}_labels']} ({tuple(labels.shape)}) do not match"
            )
        check_labels(labels, _CLASSES, files[f"{part}_labels"])
    size = tuple(arrays["train_images"].shape[1:])
    if tuple(arrays["test_images"].shape[1:]) != size:
        raise DataError(
            f"{files['test_images']} holds images of "
            f"{'x'.join(map(str, arrays['test_images'].shape[1:]))} pixels, "
            f"{files['train_images']} of {'x'.join(map(str, size))}"
        )
    return DataSplit(
        ArrayDataset(arrays["train_images"].unsqueeze(1), arrays["train_labels"], [mean], [std]),
        ArrayDataset(arrays["test_images"].unsqueeze(1), arrays["test_labels"], [mean], [std]),
        num_classes=_CLASSES,
        input_shape=(1, *size),
    )


def _find_files(folder, directories):
    """Return {key: path} from the first directory holding all four files, else DataError."""
    for directory in directories:
        found = {}
        for key, name in FILES.items():
            for candidate in (directory / name, directory / (name + ".gz")):
                if candidate.is_file():
                    found[key] = candidate
                    break
        if len(found) == len(FILES):
            return found
    searched = ", ".join(str(directory) for directory in directories)
    raise DataError(
        f"{folder} not found: put {', '.join(FILES.values())} (each may end in .gz) into "
        f"{directories[0]} (searched {searched}), or pass --download when online"
    )
