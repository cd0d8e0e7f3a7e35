"""ImageNet (ILSVRC-2012) as two ``torchvision.datasets.ImageFolder`` trees: train and val.

Training images are randomly resized-cropped to 224 and flipped; validation images resized to
256 and centre-cropped to 224. Hidden files and folders are skipped. Images are decoded as they
are read, so an unreadable one is found when training reaches it: a ``DataError`` naming it.
"""

import functools
import os
from pathlib import Path

import torch
import torchvision
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader, has_file_allowed_extension
from torchvision.transforms import v2

from datasets.split import DataError, DataSplit

LAYOUT = (
    "put one folder per class (e.g. n01440764/) with its JPEG images into "
    "DATA_DIR/train and DATA_DIR/val"
)
_MEAN = [0.485, 0.456, 0.406]
_STD = [0.229, 0.224, 0.225]


def load(data_dir):
    """Return the ImageNet ``DataSplit`` from ``data_dir/train`` and ``data_dir/val``."""
    root = Path(data_dir)
    missing = [str(root / part) for part in ("train", "val") if not (root / part).is_dir()]
    if missing:
        raise DataError(
            f"ImageNet not found: {', '.join(missing)} missing; "
            + LAYOUT.replace("DATA_DIR", str(root))
        )
    finish = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(_MEAN, _STD)]
    train = _folder(
        root / "train", v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()] + finish)
    )
    test = _folder(root / "val", v2.Compose([v2.Resize(256), v2.CenterCrop(224)] + finish))
    if test.classes != train.classes:  # ImageFolder numbers each tree's folders on its own
        missing = sorted(set(train.classes) - set(test.classes))
        extra = sorted(set(test.classes) - set(train.classes))
        raise DataError(
            f"ImageNet: {root / 'val'} and {root / 'train'} differ in class folders "
            f"(missing in val: {', '.join(missing[:5]) or 'none'}; only in val: "
            f"{', '.join(extra[:5]) or 'none'}), so their labels would not match"
        )
    return DataSplit(train, test, num_classes=len(train.classes), input_shape=(3, 224, 224))


def _visible_image(path, root):
    """An image file by its extension, neither hidden (``._x.JPEG``: macOS AppleDouble) nor in a
    hidden folder below ``root`` (``n01440764/.ipynb_checkpoints/``), where ``path`` starts with
    the string ``root`` (as ``ImageFolder`` joins them; a string test: ImageNet has 1.3M files)."""
    return os.sep + "." not in path[len(root) :] and has_file_allowed_extension(
        path, IMG_EXTENSIONS
    )


def _open_image(path):
    """The image at ``path`` as RGB; an unreadable file is a ``DataError`` naming it."""
    try:
        return default_loader(path)
    except (OSError, SyntaxError, ValueError) as error:  # PIL: truncated, unidentified, damaged
        raise DataError(
            f"{path}: unreadable image ({type(error).__name__}: {error}); remove or replace it"
        ) from None


class _ClassFolders(torchvision.datasets.ImageFolder):
    """``ImageFolder`` whose classes are the visible folders: a hidden one (``.ipynb_checkpoints``,
    ``.git``) is no class (torchvision's own counts it, shifting every later label). Hidden files,
    and files in hidden folders, are no images; an unreadable image raises ``DataError`` naming
    its file."""

    def __init__(self, root, transform):
        super().__init__(
            root,
            transform,
            loader=_open_image,
            is_valid_file=functools.partial(_visible_image, root=os.path.expanduser(root)),
        )

    def find_classes(self, directory):
        classes = sorted(
            entry.name
            for entry in os.scandir(directory)
            if entry.is_dir() and not entry.name.startswith(".")
        )
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: index for index, name in enumerate(classes)}


def _folder(path, transform):
    """The class-folder tree at ``path``; its complaints (no class folders, an empty class) as
    ``DataError``."""
    try:
        return _ClassFolders(path, transform)
    except FileNotFoundError as error:
        raise DataError(
            f"ImageNet: {path}: {error}; {LAYOUT.replace('DATA_DIR', str(path.parent))} "
            "(val too must be sorted into class folders)"
        ) from None
