"""Networks by name.

``models.create(name, num_classes, input_shape)`` builds a freshly initialised ``torch.nn.Module``
for inputs of shape ``input_shape`` = (channels, height, width); text models (``lstmimdb``,
``bert-tiny``, ``bert-base``) take ``(sequence length,)`` and a ``vocab_size``.
``models.task(name)`` names the kind of data a model trains on. Models know nothing about how
their gradients are synchronized.
"""

from models.registry import available, create, task

__all__ = ["available", "create", "task"]
