"""The synthetic CIFAR-shaped data set of timing runs: shapes, classes and determinism."""

import torch

import datasets
from datasets import synthetic


def test_cifar_shaped_images_and_ten_classes_the_same_on_every_load():
    first, second = (
        datasets.load("synthetic-cifar10", None),
        datasets.load("synthetic-cifar10", "ignored"),
    )
    assert (first.num_classes, first.input_shape) == (10, (3, 32, 32))
    assert (len(first.train), len(first.test)) == (synthetic.TRAIN_IMAGES, synthetic.TEST_IMAGES)
    for part in ("train", "test"):
        a, b = getattr(first, part), getattr(second, part)
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    image, label = first.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= int(label) < 10
    assert set(first.train.labels.tolist()) == set(range(10))
    assert not torch.equal(first.train.images[:512], first.test.images)  # test images are others
    pixels = torch.stack([first.train[i][0] for i in range(256)])
    assert abs(pixels.mean().item()) < 0.05 and abs(pixels.std().item() - 1) < 0.05  # normalised
