"""The gradients the benchmark and the simulator synchronize.

Seeded synthetic ones, or a real model's on random batches. Every source has ``numel`` and
``get(rank, call)``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "TRAINER_PACKAGES",
    "SyntheticGradients",
    "ModelGradients",
    "OnDevice",
    "trainer_package",
    "mix_seed",
    "gradient_source",
]

#: The trainer's packages (in the repository folder, not installed) that models may import.
TRAINER_PACKAGES = ("models", "datasets")


class SyntheticGradients:
    """Seeded heavy-tailed gradients: ``g[c, r] = scale * N(0, 1)``.

    ``scale`` is one log-normal magnitude per coordinate (``exp(0.8 z)``), shared by every rank
    and call, so, as in real training, the same coordinates tend to be large everywhere while
    the values differ per rank and call. The marginal is a normal/log-normal mixture (heavy
    tailed); each call costs one ``randn`` of length n.
    """

    def __init__(self, numel: int, seed: int) -> None:
        self.numel = numel
        self.seed = seed
        generator = torch.Generator().manual_seed(mix_seed(seed, -1, -1))
        self.scale = torch.randn(numel, generator=generator).mul_(0.8).exp_()

    def get(self, rank: int, call: int) -> torch.Tensor:
        """The gradient of ``rank`` at call ``call`` (float32, length ``numel``)."""
        generator = torch.Generator().manual_seed(mix_seed(self.seed, rank, call))
        return torch.randn(self.numel, generator=generator).mul_(self.scale)


class ModelGradients:
    """Real gradients.

    The cross-entropy gradient of model ``name`` (weights seeded by ``seed``, the same on every
    rank) on a random batch seeded by (seed, rank, call). One forward and backward pass per call:
    cheap for small models, seconds for VGG-16 on a CPU.
    """

    def __init__(self, name: str, seed: int, batch: int, input_shape: tuple, classes: int) -> None:
        models = trainer_package("models")
        if batch < 1 or classes < 2:
            raise ValueError(
                f"model gradients need --batch >= 1 and --classes >= 2, got {batch} and {classes}"
            )
        torch.manual_seed(seed)
        self.model = models.create(name, classes, input_shape)
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.seed, self.batch, self.input_shape, self.classes = seed, batch, input_shape, classes
        try:  # a shape too small for the network fails here, not in the first timed call
            with torch.no_grad():
                self.model(torch.zeros(min(batch, 2), *input_shape))
        except (RuntimeError, ValueError) as error:
            raise ValueError(
                f"model {name!r} does not take inputs of shape {','.join(map(str, input_shape))} "
                f"(--input-shape): {str(error).splitlines()[0]}"
            ) from None

    def get(self, rank: int, call: int) -> torch.Tensor:
        """The flattened gradient of ``rank`` at call ``call``."""
        generator = torch.Generator().manual_seed(mix_seed(self.seed, rank, call))
        images = torch.randn(self.batch, *self.input_shape, generator=generator)
        labels = torch.randint(0, self.classes, (self.batch,), generator=generator)
        self.model.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(self.model(images), labels).backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).float()


class OnDevice:
    """``source``'s gradients moved to ``device`` (the same values: made on the CPU, then moved)."""

    def __init__(self, source, device: torch.device) -> None:
        self.source, self.device, self.numel = source, device, source.numel

    def get(self, rank: int, call: int) -> torch.Tensor:
        """``source.get(rank, call)`` on the device."""
        return self.source.get(rank, call).to(self.device)


def trainer_package(name: str):
    """The trainer's package ``name`` (``models``), imported without touching ``sys.path``.

    The trainer's packages are not installed with the library (``pip install -e .`` leaves them
    out, see pyproject.toml): where ``import models`` finds nothing, the package is loaded from
    the repository folder beside this one, with the other trainer packages it imports
    (``datasets`` for BERT's vocabulary), so ``--gradient model:NAME`` works from any folder.

    Raises:
        ValueError: the package is neither importable nor in the repository folder.
    """
    found = importlib.util.find_spec(name)
    if found is not None:
        return importlib.import_module(name)
    root = Path(__file__).resolve().parent.parent
    for package in (name, *(other for other in TRAINER_PACKAGES if other != name)):
        folder = root / package
        if package in sys.modules or importlib.util.find_spec(package) is not None:
            continue
        if not (folder / "__init__.py").is_file():
            if package == name:
                raise ValueError(
                    f"--gradient model:NAME needs the trainer's {name} package, which is "
                    f"neither installed nor in {root}"
                )
            continue
        spec = importlib.util.spec_from_file_location(
            package, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[package]
            raise
    return sys.modules[name]


def mix_seed(seed: int, rank: int, call: int) -> int:
    """A 63-bit generator seed from (seed, rank, call); distinct tuples give unrelated streams."""
    return int(
        np.random.SeedSequence([seed, rank + 1, call + 1]).generate_state(2, np.uint64)[0] >> 1
    )


def gradient_source(
    spec: str,
    numel: int,
    seed: int,
    batch: int = 8,
    input_shape: str = "3,32,32",
    classes: int = 10,
):
    """The source named by ``spec``.

    ``"synthetic"`` (:class:`SyntheticGradients` of length ``numel``) or ``"model:NAME"``
    (:class:`ModelGradients`, ``input_shape`` written C,H,W); ``ValueError`` for options that cannot
    make one.
    """
    if spec == "synthetic":
        return SyntheticGradients(numel, seed)
    kind, _, name = spec.partition(":")
    if kind != "model" or not name:
        raise ValueError(f"--gradient must be 'synthetic' or 'model:NAME', got {spec!r}")
    parts = input_shape.split(",")
    if len(parts) != 3 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
        raise ValueError(f"--input-shape takes three integers >= 1, C,H,W, got {input_shape!r}")
    return ModelGradients(name, seed, batch, tuple(map(int, parts)), classes)
