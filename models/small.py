"""Small networks for the small data sets (digits, MNIST, Fashion-MNIST)."""

from torch import nn


class SmallCNN(nn.Module):
    """Two conv-BN-ReLU-maxpool blocks (16 and 32 channels) and a 128-unit classifier.

    Each block halves height and width, so inputs need height and width of at least 4.
    """

    def __init__(self, num_classes, input_shape):
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            _conv_block(channels, 16),
            _conv_block(16, 32),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * (height // 4) * (width // 4), 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, images):
        return self.classifier(self.features(images))


def _conv_block(in_channels, out_channels):
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class MLP(nn.Module):
    """A two-hidden-layer perceptron (256 units each) on the flattened image."""

    def __init__(self, num_classes, input_shape):
        super().__init__()
        channels, height, width = input_shape
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * height * width, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, num_classes),
        )

    def forward(self, images):
        return self.layers(images)


class WideMLP(nn.Module):
    """Three hidden layers of 2048 units on the flattened image: 10,020,874 parameters on
    28x28 grey images with 10 classes, a model whose gradient is big enough for communication
    to matter yet cheap on a CPU (no convolutions)."""

    def __init__(self, num_classes, input_shape, width=2048):
        super().__init__()
        channels, height, width_in = input_shape
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * height * width_in, width),
            nn.ReLU(inplace=True),
            nn.Linear(width, width),
            nn.ReLU(inplace=True),
            nn.Linear(width, width),
            nn.ReLU(inplace=True),
            nn.Linear(width, num_classes),
        )

    def forward(self, images):
        return self.layers(images)
