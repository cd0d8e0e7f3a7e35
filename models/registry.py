"""The name -> constructor table behind ``models.create``.

Constructors are named by module and function and imported on first use: torchvision (for
the ImageNet networks) adds seconds to the start-up of every rank, which runs with other
models should not pay.
"""

import importlib

# name: (module, constructor, the task it is built for: see ``datasets.task``)
_FACTORIES = {
    "cnn": ("models.small", "SmallCNN", "image-classification"),
    "mlp": ("models.small", "MLP", "image-classification"),
    "widemlp": ("models.small", "WideMLP", "image-classification"),
    "vgg16": ("models.vgg", "vgg16", "image-classification"),
    "vgg19": ("models.vgg", "vgg19", "image-classification"),
    "resnet20": ("models.resnet_cifar", "resnet20", "image-classification"),
    "resnet56": ("models.resnet_cifar", "resnet56", "image-classification"),
    "resnet110": ("models.resnet_cifar", "resnet110", "image-classification"),
    "resnet50": ("models.imagenet", "resnet50", "image-classification"),
    "alexnet": ("models.imagenet", "alexnet", "image-classification"),
    "lstmimdb": ("models.lstm", "lstmimdb", "text-classification"),
    "bert-tiny": ("models.bert", "bert_tiny", "masked-lm"),
    "bert-base": ("models.bert", "bert_base", "masked-lm"),
}


def available():
    """Return the sorted list of model names ``create`` accepts."""
    return sorted(_FACTORIES)


def task(name):
    """The task model ``name`` is built for: the ``datasets.task`` of the data it trains on."""
    return _entry(name)[2]


def create(name, num_classes, input_shape, vocab_size=None):
    """Build model ``name`` for ``num_classes`` classes and inputs of shape ``input_shape``:
    (C, H, W) images, or (longest sequence,) token indices out of ``vocab_size`` (text models).

    Raises ``ValueError`` listing the valid names when ``name`` is unknown, and when a text
    model gets no ``vocab_size``.
    """
    module, function, kind = _entry(name)
    factory = getattr(importlib.import_module(module), function)
    sizes = {"num_classes": num_classes, "input_shape": tuple(input_shape)}
    if kind != "image-classification":
        if vocab_size is None:
            raise ValueError(f"model {name} reads text: it needs a vocab_size")
        sizes["vocab_size"] = vocab_size
    return factory(**sizes)


def _entry(name):
    if name not in _FACTORIES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(available())}")
    return _FACTORIES[name]
