"""ImageNet networks from torchvision, built untrained for ``num_classes`` classes.

Their first convolution is rebuilt when the images do not have 3 channels. AlexNet needs at
least 63x63 pixels, ResNet-50 at least 32x32.
"""

import torchvision
from torch import nn


def resnet50(num_classes, input_shape):
    """torchvision's ResNet-50 (25.6 M parameters at 1000 classes)."""
    model = torchvision.models.resnet50(num_classes=num_classes)
    model.conv1 = _with_in_channels(model.conv1, input_shape[0])
    return model


def alexnet(num_classes, input_shape):
    """torchvision's AlexNet (61 M parameters at 1000 classes)."""
    model = torchvision.models.alexnet(num_classes=num_classes)
    model.features[0] = _with_in_channels(model.features[0], input_shape[0])
    return model


def _with_in_channels(conv, channels):
    """Return ``conv`` itself, or a fresh copy of its geometry taking ``channels`` inputs."""
    if channels == conv.in_channels:
        return conv
    return nn.Conv2d(
        channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        bias=conv.bias is not None,
    )
