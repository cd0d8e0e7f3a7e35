"""Data set loaders on tiny files generated in the real formats, and their error messages."""

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import datasets
from datasets.mnist import DEBIAN_FASHION_MNIST


def _write_cifar_batch(path, count, label_key, num_classes, seed):
    rng = np.random.default_rng(seed)
    batch = {
        b"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
        label_key: rng.integers(0, num_classes, count).tolist(),
        b"batch_label": b"generated",
    }
    with open(path, "wb") as stream:
        pickle.dump(batch, stream)
    return batch


def test_cifar10_pickle_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train = [
        _write_cifar_batch(folder / f"data_batch_{i}", 4, b"labels", 10, i) for i in range(1, 6)
    ]
    test = _write_cifar_batch(folder / "test_batch", 3, b"labels", 10, 9)
    split = datasets.load("cifar10", tmp_path)
    assert (len(split.train), len(split.test)) == (20, 3)
    assert split.num_classes == 10 and split.input_shape == (3, 32, 32)
    image, label = split.test[1]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label == test[b"labels"][1]
    # Test images are not augmented: undoing the normalisation gives back the stored pixels.
    pixels = image * split.test.std + split.test.mean
    expected = torch.from_numpy(test[b"data"][1].reshape(3, 32, 32).astype(np.float32)) / 255
    assert torch.allclose(pixels, expected, atol=1e-5)
    assert split.train[4][1] == train[1][b"labels"][0]  # batches concatenated in order
    assert split.train[0][0].shape == (3, 32, 32)  # augmented training images keep their shape


def test_cifar100_uses_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = _write_cifar_batch(folder / "train", 5, b"fine_labels", 100, 1)
    _write_cifar_batch(folder / "test", 2, b"fine_labels", 100, 2)
    split = datasets.load("cifar100", tmp_path)
    assert split.num_classes == 100 and len(split.train) == 5
    assert [int(split.train[i][1]) for i in range(5)] == train[b"fine_labels"]


def _write_idx(path, array, compress):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + b"".join(
        struct.pack(">I", size) for size in array.shape
    )
    opener = gzip.open if compress else open
    with opener(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_in_torchvision_layout(tmp_path, name, folder, compress):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 28, 28))
    suffix = ".gz" if compress else ""
    _write_idx(raw / f"train-images-idx3-ubyte{suffix}", images, compress)
    _write_idx(raw / f"train-labels-idx1-ubyte{suffix}", np.arange(6) % 10, compress)
    _write_idx(raw / f"t10k-images-idx3-ubyte{suffix}", images[:2], compress)
    _write_idx(raw / f"t10k-labels-idx1-ubyte{suffix}", np.array([3, 4]), compress)
    split = datasets.load(name, tmp_path)
    assert (len(split.train), len(split.test)) == (6, 2)
    assert split.input_shape == (1, 28, 28)
    image, label = split.test[1]
    assert label == 4
    pixels = image * split.test.std + split.test.mean
    assert torch.allclose(pixels[0] * 255, torch.tensor(images[1], dtype=torch.float32), atol=1e-3)


def test_digits_ship_with_scikit_learn():
    split = datasets.load("digits", None)
    assert (len(split.train), len(split.test)) == (1437, 360)
    assert split.input_shape == (1, 8, 8) and split.num_classes == 10
    assert set(int(split.test[i][1]) for i in range(len(split.test))) == set(range(10))


@pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(),
    reason="apt-get install dataset-fashion-mnist to test the Debian location",
)
def test_fashion_mnist_from_the_debian_package(tmp_path):
    split = datasets.load("fashion-mnist", tmp_path)
    assert (len(split.train), len(split.test)) == (60000, 10000)


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("cifar10", "cifar-10-batches-py lacks data_batch_1"),
        ("cifar100", "cifar-100-python lacks train, test"),
        ("mnist", "MNIST/raw"),
        ("imagenet", "train"),
    ],
)
def test_missing_files_say_what_to_put_where(tmp_path, name, fragment):
    with pytest.raises(datasets.DataError, match=fragment) as error:
        datasets.load(name, tmp_path)
    assert str(tmp_path) in str(error.value)


def test_imagenet_image_folders(tmp_path):
    from PIL import Image

    for part in ("train", "val"):
        for label in ("n01", "n02"):
            (tmp_path / part / label).mkdir(parents=True)
            Image.new("RGB", (40, 30), color=(10, 20, 30)).save(tmp_path / part / label / "a.JPEG")
    split = datasets.load("imagenet", tmp_path)
    assert split.num_classes == 2 and len(split.train) == 2
    image, label = split.test[1]
    assert image.shape == (3, 224, 224) and label == 1


def test_unknown_data_set_lists_the_valid_names():
    with pytest.raises(ValueError, match="cifar10.*digits"):
        datasets.load("svhn", None)
    with pytest.raises(datasets.DataError, match="cannot be downloaded"):
        datasets.download("imagenet", "anywhere")


def _image_folders(root, parts):
    """``parts``: {"train": ["n01", ...], "val": [...]}: one tiny JPEG per class folder."""
    from PIL import Image

    for part, labels in parts.items():
        for label in labels:
            (root / part / label).mkdir(parents=True)
            Image.new("RGB", (40, 30)).save(root / part / label / "a.JPEG")


def test_imagenet_val_with_other_class_folders_is_refused(tmp_path):
    """ImageFolder numbers each tree alone: val without n01 would label n02 as 0, train's n01."""
    _image_folders(tmp_path, {"train": ["n01", "n02", "n03"], "val": ["n02", "n03"]})
    with pytest.raises(datasets.DataError, match="missing in val: n01; only in val: none"):
        datasets.load("imagenet", tmp_path)


def test_imagenet_hidden_folders_are_no_classes(tmp_path):
    """A hidden folder sorts first: counted as a class, it would shift every label by one (and
    an empty one would stop the load)."""
    from PIL import Image

    _image_folders(tmp_path, {"train": ["n01", "n02"], "val": ["n01", "n02"]})
    for part in ("train", "val"):
        (tmp_path / part / ".ipynb_checkpoints").mkdir()
        Image.new("RGB", (40, 30)).save(tmp_path / part / ".ipynb_checkpoints" / "b.JPEG")
    (tmp_path / "train" / ".git").mkdir()
    split = datasets.load("imagenet", tmp_path)
    assert split.num_classes == 2 and split.train.classes == ["n01", "n02"]
    assert [label for _, label in split.test.samples] == [0, 1]


def test_imagenet_flat_val_folder_says_how_to_sort_it(tmp_path):
    from PIL import Image

    _image_folders(tmp_path, {"train": ["n01"]})
    (tmp_path / "val").mkdir()
    Image.new("RGB", (40, 30)).save(tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(datasets.DataError, match="val too must be sorted into class folders"):
        datasets.load("imagenet", tmp_path)


def _mnist_files(
    folder, train_images=6, train_labels=6, truncate=0, test=2, test_size=28, top_label=9
):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, array in (
        ("train-images-idx3-ubyte", rng.integers(0, 256, (train_images, 28, 28))),
        ("train-labels-idx1-ubyte", np.r_[top_label, rng.integers(0, 10, train_labels - 1)]),
        ("t10k-images-idx3-ubyte", rng.integers(0, 256, (test, test_size, test_size))),
        ("t10k-labels-idx1-ubyte", rng.integers(0, 10, test)),
    ):
        _write_idx(folder / name, array, compress=False)
    if truncate:
        path = folder / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:-truncate])


@pytest.mark.parametrize(
    "files,message",
    [
        (
            dict(truncate=100),
            "train-images-idx3-ubyte holds 4604 bytes of data, its header announces 4704",
        ),
        (
            dict(train_labels=7),
            r"\(6, 28, 28\)\) and .*train-labels-idx1-ubyte \(\(7,\)\) do not match",
        ),
        (
            dict(top_label=200),
            r"train-labels-idx1-ubyte: labels range over 0..200, outside the 10 classes",
        ),
        (
            dict(test_size=14),
            "t10k-images-idx3-ubyte holds images of 14x14 pixels, "
            ".*train-images-idx3-ubyte of 28x28",
        ),
        (dict(test=0), "mnist in .*: the test part holds no images"),
    ],
)
def test_damaged_idx_files_are_named(tmp_path, files, message):
    _mnist_files(tmp_path / "MNIST" / "raw", **files)
    with pytest.raises(datasets.DataError, match=message):
        datasets.load("mnist", tmp_path)


def test_a_truncated_cifar_batch_is_named(tmp_path):
    folder = _cifar10_folder(tmp_path)
    (folder / "data_batch_3").write_bytes((folder / "data_batch_3").read_bytes()[:500])
    with pytest.raises(datasets.DataError, match="data_batch_3 is not a CIFAR batch"):
        datasets.load("cifar10", tmp_path)


@pytest.mark.parametrize(
    "data,labels,message",
    [
        (
            np.zeros((4, 32, 32, 3), np.uint8),
            [0] * 4,
            r"its data is uint8 of shape \(4, 32, 32, 3\), not a CIFAR batch's uint8 rows",
        ),
        (np.zeros((4, 3072), np.float32), [0] * 4, "its data is float32 of shape"),
        (np.zeros((4, 3072), np.uint8), [0.0, 1.7, 2.0, 3.0], "its labels are float64 of shape"),
        (np.zeros((4, 3072), np.uint8), [0] * 3, "4 images but 3 labels"),
    ],
)
def test_a_cifar_batch_of_another_layout_is_refused(tmp_path, data, labels, message):
    """Re-saved batches (channels last, as torchvision keeps them; floats) would otherwise be
    reshaped or cast into wrong images without a word."""
    folder = _cifar10_folder(tmp_path)
    with open(folder / "data_batch_2", "wb") as stream:
        pickle.dump({b"data": data, b"labels": labels}, stream)
    with pytest.raises(datasets.DataError, match="data_batch_2: " + message):
        datasets.load("cifar10", tmp_path)


def test_a_failed_torchvision_download_is_a_data_error(tmp_path, monkeypatch):
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(
        datasets.DataError, match="downloading mnist into .* failed: Error downloading"
    ):
        datasets.download("mnist", tmp_path)


def test_a_failed_download_removes_the_empty_directories_it_made(tmp_path, monkeypatch):
    import torchvision

    def offline(root, download):
        (Path(root) / "MNIST" / "raw").mkdir(parents=True)  # as torchvision does, before fetching
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(datasets.DataError, match="failed"):
        datasets.download("mnist", tmp_path / "new" / "data")
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "data"
    (existing / "empty").mkdir(parents=True)  # the user's: stays, as does a file
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(datasets.DataError, match="failed"):
        datasets.download("mnist", existing)
    assert sorted(path.name for path in existing.iterdir()) == ["empty", "notes.txt"]


@pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="needs the dataset-fashion-mnist package"
)
def test_fashion_mnist_prefers_its_own_copy_to_unnamed_files_in_the_data_dir(tmp_path):
    _mnist_files(tmp_path)  # MNIST-style files lying flat in DATA_DIR
    assert len(datasets.load("fashion-mnist", tmp_path).train) == 60000
    assert len(datasets.load("mnist", tmp_path).train) == 6


def _cifar10_folder(root):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _write_cifar_batch(folder / name, 4, b"labels", 10, 0)
    return folder


@pytest.mark.parametrize(
    "label,message",
    [(10, "labels range over .*10, outside the 10 classes 0..9"), (-1, "labels range over -1..")],
)
def test_cifar_labels_outside_the_classes_are_refused(tmp_path, label, message):
    folder = _cifar10_folder(tmp_path)
    batch = pickle.loads((folder / "test_batch").read_bytes())
    batch[b"labels"][2] = label
    (folder / "test_batch").write_bytes(pickle.dumps(batch))
    with pytest.raises(datasets.DataError, match=f"test_batch: {message}"):
        datasets.load("cifar10", tmp_path)


def test_cifar_batches_resaved_with_str_keys_load_and_odd_pickles_are_named(tmp_path):
    folder = _cifar10_folder(tmp_path)
    batch = pickle.loads((folder / "data_batch_2").read_bytes())
    (folder / "data_batch_2").write_bytes(
        pickle.dumps({key.decode(): value for key, value in batch.items()})
    )
    assert len(datasets.load("cifar10", tmp_path).train) == 20
    # A pickle naming a module that is not installed, and one of another type.
    (folder / "data_batch_4").write_bytes(b"cno_such_module\nThing\n.")
    with pytest.raises(
        datasets.DataError, match="data_batch_4 is not a CIFAR batch .*ModuleNotFoundError"
    ):
        datasets.load("cifar10", tmp_path)
    (folder / "data_batch_4").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(
        datasets.DataError, match="data_batch_4 is not a CIFAR batch .*AttributeError"
    ):
        datasets.load("cifar10", tmp_path)


def test_mnist_image_size_comes_from_the_files(tmp_path):
    _mnist_files(tmp_path / "MNIST" / "raw")
    assert datasets.load("mnist", tmp_path).input_shape == (1, 28, 28)


def test_imagenet_skips_hidden_files_and_names_an_unreadable_image(tmp_path):
    from PIL import Image

    _image_folders(tmp_path, {"train": ["n01", "n02"], "val": ["n01", "n02"]})
    (tmp_path / "train" / "n01" / "._a.JPEG").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    checkpoints = tmp_path / "train" / "n01" / ".ipynb_checkpoints"  # a hidden folder in a class
    checkpoints.mkdir()
    Image.new("RGB", (40, 30)).save(checkpoints / "a-checkpoint.JPEG")
    split = datasets.load("imagenet", tmp_path)
    assert len(split.train) == 2
    broken = tmp_path / "train" / "n02" / "b.JPEG"
    Image.new("RGB", (40, 30)).save(broken)
    broken.write_bytes(broken.read_bytes()[:200])
    split = datasets.load("imagenet", tmp_path)
    assert split.train[1][0].shape == (3, 224, 224)
    with pytest.raises(
        datasets.DataError, match=f"{broken}: unreadable image .*remove or replace it"
    ):
        split.train[2]
