"""The name -> constructor table behind ``models.create``.

Constructors are named by module and function and imported on first use: torchvision (for
the ImageNet networks) adds seconds to the start-up of every rank, which runs with other
models should not pay.
"""
import importlib

_FACTORIES = {
    "cnn": ("models.small", "SmallCNN"),
    "mlp": ("models.small", "MLP"),
    "vgg16": ("models.vgg", "vgg16"),
    "vgg19": ("models.vgg", "vgg19"),
    "resnet20": ("models.resnet_cifar", "resnet20"),
    "resnet56": ("models.resnet_cifar", "resnet56"),
    "resnet110": ("models.resnet_cifar", "resnet110"),
    "resnet50": ("models.imagenet", "resnet50"),
    "alexnet": ("models.imagenet", "alexnet"),
}


def available():
    """Return the sorted list of model names ``create`` accepts."""
    return sorted(_FACTORIES)


def create(name, num_classes, input_shape):
    """Build model ``name`` for ``num_classes`` classes and inputs of shape (C, H, W).

    Raises ``ValueError`` listing the valid names when ``name`` is unknown.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(available())}")
    module, function = _FACTORIES[name]
    factory = getattr(importlib.import_module(module), function)
    return factory(num_classes=num_classes, input_shape=tuple(input_shape))
