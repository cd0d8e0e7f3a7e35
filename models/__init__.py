"""Networks by name.

``models.create(name, num_classes, input_shape)`` builds a freshly initialised ``torch.nn.Module``
for inputs of shape ``input_shape`` = (channels, height, width). Models know nothing about how
their gradients are synchronized.
"""
from models.registry import available, create

__all__ = ["available", "create"]
