"""The name -> loader table behind ``datasets.load`` and ``datasets.download``."""
from datasets import cifar, digits, imagenet, mnist
from datasets.split import DataError, DataSplit

_LOADERS = {
    "digits": digits.load,
    "mnist": mnist.load_mnist,
    "fashion-mnist": mnist.load_fashion_mnist,
    "cifar10": cifar.load_cifar10,
    "cifar100": cifar.load_cifar100,
    "imagenet": imagenet.load,
}

_DOWNLOADERS = {
    "mnist": mnist.download_mnist,
    "fashion-mnist": mnist.download_fashion_mnist,
    "cifar10": cifar.download_cifar10,
    "cifar100": cifar.download_cifar100,
}


def available():
    """Return the sorted list of data set names ``load`` accepts."""
    return sorted(_LOADERS)


def load(name, data_dir):
    """Load data set ``name`` from directory ``data_dir`` (ignored by ``digits``).

    Returns a ``DataSplit``. Raises ``ValueError`` for an unknown name and ``DataError`` when
    files are missing.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of: {', '.join(available())}")
    return _LOADERS[name](data_dir)


def download(name, data_dir):
    """Fetch data set ``name`` into ``data_dir`` in torchvision's layout (needs the internet).

    ``digits`` ships with scikit-learn and needs nothing. ImageNet cannot be downloaded and
    raises ``DataError``, as does any failed download.
    """
    if name == "imagenet":
        raise DataError("ImageNet cannot be downloaded automatically; " + imagenet.LAYOUT)
    if name in _DOWNLOADERS:
        try:
            _DOWNLOADERS[name](data_dir)
        except OSError as error:  # urllib's errors are OSErrors
            raise DataError(f"downloading {name} into {data_dir} failed: {error}") from error
