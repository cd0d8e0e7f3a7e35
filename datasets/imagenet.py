"""ImageNet (ILSVRC-2012) as two ``torchvision.datasets.ImageFolder`` trees: train and val.

Training images are randomly resized-cropped to 224 and flipped; validation images resized to
256 and centre-cropped to 224.
"""
from pathlib import Path

import torch
import torchvision
from torchvision.transforms import v2

from datasets.split import DataError, DataSplit

LAYOUT = ("put one folder per class (e.g. n01440764/) with its JPEG images into "
          "DATA_DIR/train and DATA_DIR/val")
_MEAN = [0.485, 0.456, 0.406]
_STD = [0.229, 0.224, 0.225]


def load(data_dir):
    """Return the ImageNet ``DataSplit`` from ``data_dir/train`` and ``data_dir/val``."""
    root = Path(data_dir)
    missing = [str(root / part) for part in ("train", "val") if not (root / part).is_dir()]
    if missing:
        raise DataError(f"ImageNet not found: {', '.join(missing)} missing; "
                        + LAYOUT.replace("DATA_DIR", str(root)))
    finish = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(_MEAN, _STD)]
    train = torchvision.datasets.ImageFolder(
        root / "train",
        v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()] + finish))
    test = torchvision.datasets.ImageFolder(
        root / "val", v2.Compose([v2.Resize(256), v2.CenterCrop(224)] + finish))
    return DataSplit(train, test, num_classes=len(train.classes), input_shape=(3, 224, 224))
