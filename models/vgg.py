"""VGG with batch norm for CIFAR-sized images (Simonyan & Zisserman, as in the authors' code).

Five conv stages each end in a 2x2 max-pool, so inputs need height and width of at least 32.
The classifier is a single linear layer on the 512 pooled channels.
"""

from torch import nn

_STAGES = {
    "vgg16": [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]],
    "vgg19": [
        [64, 64],
        [128, 128],
        [256, 256, 256, 256],
        [512, 512, 512, 512],
        [512, 512, 512, 512],
    ],
}


class VGG(nn.Module):
    """VGG-BN built from a list of stages, each a list of conv widths followed by a max-pool."""

    def __init__(self, stages, num_classes, input_shape):
        super().__init__()
        layers = []
        in_channels = input_shape[0]
        for widths in stages:
            for width in widths:
                layers += [
                    nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
                    nn.BatchNorm2d(width),
                    nn.ReLU(inplace=True),
                ]
                in_channels = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, images):
        return self.classifier(self.pool(self.features(images)).flatten(1))


def vgg16(num_classes, input_shape):
    """VGG-16 with batch norm."""
    return VGG(_STAGES["vgg16"], num_classes, input_shape)


def vgg19(num_classes, input_shape):
    """VGG-19 with batch norm."""
    return VGG(_STAGES["vgg19"], num_classes, input_shape)
