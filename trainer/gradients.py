"""All parameter gradients as one flat buffer: what a synchronizer takes and returns."""

import torch


class GradientBuffer:
    """One flat float32 buffer, allocated once, holding the gradients of ``parameters``.

    ``gather()`` copies every ``.grad`` into it (zeros for parameters without one) and returns
    it; ``scatter(flat)`` writes a synchronized flat gradient back into the ``.grad`` fields.
    Parameters that do not require gradients are left out.
    """

    def __init__(self, parameters, device):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.sizes = [p.numel() for p in self.parameters]
        self.numel = sum(self.sizes)
        self.flat = torch.zeros(self.numel, dtype=torch.float32, device=device)
        self._views = list(self.flat.split(self.sizes))

    def gather(self):
        """Copy the current gradients into the buffer and return it (the buffer itself)."""
        for parameter, view in zip(self.parameters, self._views):
            if parameter.grad is None:
                view.zero_()
            else:
                view.copy_(parameter.grad.reshape(-1))
        return self.flat

    def scatter(self, flat):
        """Write the 1-D tensor ``flat`` (length ``numel``) back into the parameters' grads."""
        if flat.shape != self.flat.shape:
            raise ValueError(
                f"expected a flat gradient of {self.numel} elements, got shape {tuple(flat.shape)}"
            )
        for parameter, segment in zip(self.parameters, flat.split(self.sizes)):
            if parameter.grad is None:
                parameter.grad = torch.empty_like(parameter)
            parameter.grad.copy_(segment.view_as(parameter))
