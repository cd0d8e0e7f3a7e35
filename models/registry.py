"""The name -> constructor table behind ``models.create``."""
from models import imagenet, resnet_cifar, small, vgg

_FACTORIES = {
    "cnn": small.SmallCNN,
    "mlp": small.MLP,
    "vgg16": vgg.vgg16,
    "vgg19": vgg.vgg19,
    "resnet20": resnet_cifar.resnet20,
    "resnet56": resnet_cifar.resnet56,
    "resnet110": resnet_cifar.resnet110,
    "resnet50": imagenet.resnet50,
    "alexnet": imagenet.alexnet,
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
    return _FACTORIES[name](num_classes=num_classes, input_shape=tuple(input_shape))
