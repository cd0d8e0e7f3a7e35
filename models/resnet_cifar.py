"""CIFAR ResNets of He et al. (2016), depth 6n+2, with parameter-free shortcuts (option A).

Three stages of n basic blocks with 16, 32 and 64 channels; the first block of stages two and
three halves the resolution and its shortcut subsamples and zero-pads the channels.
ResNet-20 has 0.27 M parameters, ResNet-56 0.85 M, ResNet-110 1.7 M.
"""

from torch import nn
from torch.nn import functional


class PadShortcut(nn.Module):
    """Identity shortcut across a stride-2 block: subsample by two, zero-pad the new channels."""

    def __init__(self, extra_channels):
        super().__init__()
        self.extra_channels = extra_channels

    def forward(self, inputs):
        half = self.extra_channels // 2
        pad = (0, 0, 0, 0, half, self.extra_channels - half)
        return functional.pad(inputs[:, :, ::2, ::2], pad)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride == 1 and in_channels == out_channels:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = PadShortcut(out_channels - in_channels)

    def forward(self, inputs):
        out = functional.relu(self.bn1(self.conv1(inputs)))
        out = self.bn2(self.conv2(out))
        return functional.relu(out + self.shortcut(inputs))


class CifarResNet(nn.Module):
    """ResNet with ``blocks_per_stage`` basic blocks in each of its three stages."""

    def __init__(self, blocks_per_stage, num_classes, input_shape):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
        )
        blocks = []
        in_channels = 16
        for stage, width in enumerate((16, 32, 64)):
            for index in range(blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(in_channels, width, stride))
                in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(64, num_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, images):
        features = self.blocks(self.stem(images))
        return self.classifier(self.pool(features).flatten(1))


def resnet20(num_classes, input_shape):
    """ResNet-20 (3 blocks per stage)."""
    return CifarResNet(3, num_classes, input_shape)


def resnet56(num_classes, input_shape):
    """ResNet-56 (9 blocks per stage)."""
    return CifarResNet(9, num_classes, input_shape)


def resnet110(num_classes, input_shape):
    """ResNet-110 (18 blocks per stage)."""
    return CifarResNet(18, num_classes, input_shape)
