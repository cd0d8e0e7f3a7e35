"""The learning-rate schedule of the authors' runs: linear warm-up from lr/P, then step decays."""

import bisect

from torch.optim.lr_scheduler import LambdaLR


class WarmupMultiStep:
    """Factor of the base learning rate at optimizer step ``step`` (a ``LambdaLR`` lambda).

    With ``epoch = step / iters_per_epoch`` (fractional):
    - during warm-up (``epoch < warmup_epochs``) the factor grows linearly, step by step, from
      ``start_factor`` (1/P in the authors' runs) to 1;
    - afterwards it is ``gamma ** (number of milestones <= epoch)``; a milestone m means "from
      the start of the (m+1)-th epoch", e.g. milestones [81, 122, 155] with gamma 0.1 give
      0.1 from epoch 81, 0.01 from 122, 0.001 from 155 (0-based epoch numbers).
    """

    def __init__(self, iters_per_epoch, warmup_epochs, start_factor, milestones, gamma):
        if iters_per_epoch < 1:
            raise ValueError("iters_per_epoch must be at least 1")
        self.iters_per_epoch = iters_per_epoch
        self.warmup_epochs = warmup_epochs
        self.start_factor = start_factor
        self.milestones = sorted(milestones)
        self.gamma = gamma

    def __call__(self, step):
        epoch = step / self.iters_per_epoch
        if epoch < self.warmup_epochs:
            return self.start_factor + (1.0 - self.start_factor) * epoch / self.warmup_epochs
        return self.gamma ** bisect.bisect_right(self.milestones, epoch)


def make_scheduler(optimizer, iters_per_epoch, warmup_epochs, workers, milestones, gamma):
    """A ``LambdaLR`` over ``optimizer`` following ``WarmupMultiStep``, stepped once per iteration.

    Warm-up starts from lr / ``workers``; its state (the step count) goes into checkpoints.
    """
    factor = WarmupMultiStep(iters_per_epoch, warmup_epochs, 1.0 / workers, milestones, gamma)
    return LambdaLR(optimizer, factor)
