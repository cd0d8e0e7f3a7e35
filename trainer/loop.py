"""The data-parallel training loop."""

import itertools
import math
import sys
import time

import torch
from tqdm import tqdm

from trainer.checkpoint import Position, restore_rng, rng_state
from trainer.distributed import broadcast_tensors
from trainer.evaluation import evaluate, prediction_loss, predictions
from trainer.metrics import EpochMeter
from trainer.stopping import DIVERGED, INTERRUPTED, Interrupt, Stopped, agree_flags

PROGRESS_SECONDS = 30.0  # between rank 0's progress lines when stdout is not a terminal


class Trainer:
    """Trains ``model`` on every rank in lock-step; ranks differ only in the data they read.

    One iteration on each rank:
    1. forward and backward pass on this rank's batch (``compute_seconds``), the gradient then
       clipped to L2 norm ``clip_grad_norm`` if that is set (each worker its own, as the
       authors do);
    2. every parameter's gradient is copied into one flat buffer, allocated once;
    3. ``synchronizer.allreduce`` writes the averaged gradient, identical on every rank, into
       one result buffer, also allocated once (``sync_seconds`` covers steps 2-4, not the
       agreement on stopping below, which counts in the rest of the iteration; the
       synchronizer reports selection and communication);
    4. the average is written back into the parameters' ``.grad``;
    5. the optimizer steps (SGD's momentum and weight decay act on the synchronized gradient,
       as in the authors' code), then the learning-rate schedule.
    Since all ranks start from rank 0's weights and apply the same update, weights stay equal.
    Between steps 2 and 3 the ranks agree whether to stop (``trainer.stopping``): on Ctrl-C, or
    when any loss or gradient is not finite, every rank raises ``Stopped`` at the same step.
    After each epoch, rank 0's buffers (batch-norm statistics) are copied to all ranks, the test
    set is evaluated once across ranks, a row is logged and, with ``checkpoints``, saved. With
    ``eval_every`` N, the same is done (without the checkpoint) after every N-th iteration of the
    run within an epoch, each row covering the iterations since the last one. Evaluating does
    not change training: the data order depends only on the seed and the epoch, and every
    random generator is restored after an evaluation (a test loader draws from torch's), so two
    runs that differ only in ``eval_every`` train on the same batches into the same weights.

    ``synchronizer`` speaks the protocol of :mod:`trainer.flat` (``finish``, ``stats``,
    ``forward_model``, ``overlaps_backward``, the state methods), and the loop has one path for
    all of them. That is the blocking (flat) mode, the authors' (``--no-overlap``,
    :class:`trainer.flat.FlatSync`). With an overlapped
    ``synchronizer`` (:class:`trainer.overlap.OverlappedSync`, the default) steps 2-4 happen
    bucket by bucket during backward; after it the loop waits for the last bucket
    (``exposed_sync_seconds``; ``sync_seconds`` is the buckets' whole time on the communication
    thread), and the ranks then agree whether to stop, an average that is not finite counting
    as a gradient that is not (the same on every rank).

    A DDP method (:class:`trainer.torch_ddp.DDPSync`) is overlapped too: the training forward
    goes through its DDP wrapper, DDP averages the buckets during backward, and compute ends
    where its ``stats["compute_end"]`` says (the last gradient ready or bucket hook called),
    so the wait inside backward counts as exposed synchronization, not compute. With
    ``clip_grad_norm`` it clips the average.

    With local steps (:class:`trainer.local.LocalSync`, ``--local-steps`` H > 1) ``finish``
    averages nothing; every H-th step the synchronizer's ``after_step``, after the optimizer's
    step, synchronizes the pseudo-gradient and takes the outer step (its time counts as that
    step's exposed synchronization), and evaluations run within its ``evaluation()``: on the
    outer parameters, the same on every rank.

    ``run_info`` (compressor, density, ...) is copied into every logged row.
    """

    def __init__(
        self,
        *,
        model,
        train_loader,
        test_loader,
        synchronizer,
        optimizer,
        scheduler,
        comm,
        device,
        log,
        max_epochs,
        iters_per_epoch,
        run_info,
        checkpoints=None,
        clip_grad_norm=0.0,
        eval_every=0,
        checkpoint_every=0,
    ):
        self.model = model
        self.train_loader = train_loader
        self.test_loader = test_loader
        self.synchronizer = synchronizer
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.comm = comm
        self.device = device
        self.log = log
        self.max_epochs = max_epochs
        self.iters_per_epoch = iters_per_epoch
        self.run_info = run_info
        self.checkpoints = checkpoints
        self.clip_grad_norm = clip_grad_norm
        self.eval_every = eval_every
        self.checkpoint_every = checkpoint_every
        self.epoch = 0
        # Samples of the current epoch's permutation used before this run's first iteration in
        # it (a resume within the epoch), and the random state to restore once its batches are
        # drawn (their iterator takes a seed from torch's generator).
        self.epoch_samples = 0
        self.pending_rng = None
        self.global_step = 0
        self.interrupt = Interrupt()
        self.position = None  # "epoch E, iteration I" of the latest agreement
        self.saved_epoch = None  # this rank's newest checkpoint's position (saved, resumed from)
        self.complete_epoch = None  # the newest checkpoint every rank is known to have
        self.show_progress = comm.Get_rank() == 0 and sys.stdout.isatty()
        # Under mpiexec stdout is a pipe even from a terminal: rank 0 then prints a line now and
        # then.
        self.progress_lines = comm.Get_rank() == 0 and not self.show_progress

    def fit(self):
        """Train from ``self.epoch`` up to ``max_epochs``, evaluating and logging every epoch.

        ``Stopped`` on every rank at the same step if interrupted (Ctrl-C, SIGINT) or diverged.
        """
        try:
            with self.interrupt.deferred():
                try:
                    self._fit()
                except Stopped:  # every rank stops at this step: nothing left in flight
                    self.synchronizer.close()
                    raise
        finally:
            self.log.close()

    def _fit(self):
        for epoch in range(self.epoch, self.max_epochs):
            self.train_loader.sampler.set_epoch(epoch, **self._start())
            self.model.train()
            meter, last_lr = self._train_epoch(epoch)
            self.epoch, self.epoch_samples = epoch + 1, 0
            self._log_row(meter, last_lr, self.epoch)
            self._save(Position(self.epoch))
            if self.epoch < self.max_epochs:  # a Ctrl-C during evaluation stops here
                self._agree(f"the end of epoch {self.epoch}")
        self.synchronizer.close()  # nothing in flight once training ends

    @property
    def global_batch(self):
        """The samples one iteration takes over all ranks (a loader without a ``batch_size``,
        as in tests: one sample an iteration per rank)."""
        return (getattr(self.train_loader, "batch_size", None) or 1) * self.comm.Get_size()

    def _start(self):
        """``set_epoch``'s keywords: where a resumed epoch starts (none for a fresh one, which a
        sampler without ``start`` also takes)."""
        return {"start": self.epoch_samples} if self.epoch_samples else {}

    def _save(self, position, epoch_samples=0):
        """Save this rank's checkpoint at ``position`` (with ``checkpoints``), ``epoch_samples``
        samples into the next epoch's permutation."""
        if self.checkpoints is not None:
            self.checkpoints.save(position, self.state_dict(epoch_samples))
            self.saved_epoch = position

    def _log_row(self, meter, last_lr, epoch, within=False):
        """Evaluate and log the row of ``meter``'s iterations (collective), in epoch ``epoch``
        (1-based); ``within``: an evaluation inside the epoch (``eval_every``), after which the
        random generators are as before it."""
        row = meter.summary(self.comm)
        saved = rng_state() if within else None
        # Batch-norm statistics drift apart per rank (each sees its own data): use rank 0's.
        broadcast_tensors(list(self.model.buffers()), self.comm)
        started = time.perf_counter()
        with self.synchronizer.evaluation():  # local SGD: the outer parameters
            test_loss, test_acc = evaluate(self.model, self.test_loader, self.device, self.comm)
        row = {
            "epoch": epoch,
            "max_epochs": self.max_epochs,
            "iters": self.global_step,
            **row,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "lr": last_lr,
            "eval_seconds": time.perf_counter() - started,
            **self.run_info,
        }
        if within:
            row["within_epoch"] = True
        if self.run_info.get("task") == "masked-lm":
            row["test_perplexity"] = math.exp(test_loss)
        stats = self.synchronizer.stats
        if stats.get("auto") is not None:  # teams="auto": SparDL's choice (per bucket, overlapped)
            row["auto"] = stats["auto"]
        if stats.get("outer_steps") is not None:  # --local-steps: outer steps, bytes per step
            row["outer_steps"] = stats["outer_steps"]
            row["bytes_per_iter_per_rank"] = row["bytes_sent_per_rank"] / max(row["epoch_iters"], 1)
        self.log.log(row)
        if saved is not None:
            restore_rng(saved)

    def _train_epoch(self, epoch):
        # Every rank starts the epoch's clock together: otherwise the time rank 0 spent logging
        # and the others spent waiting for it would count as the others' synchronization.
        self.comm.Barrier()
        meter = EpochMeter()
        done = 0  # iterations of this epoch logged in rows within it (eval_every)
        epoch_start = last_line = time.perf_counter()
        before = self.epoch_samples // self.global_batch  # iterations of it a resume skips
        iterations = max(0, min(len(self.train_loader), self.iters_per_epoch - before))
        batches = itertools.islice(iter(self.train_loader), iterations)
        if self.pending_rng is not None:  # resumed within the epoch: as it was at the save
            restore_rng(self.pending_rng)
            self.pending_rng = None
        last_lr = self.optimizer.param_groups[0]["lr"]
        for images, labels in tqdm(
            batches,
            total=iterations,
            leave=False,
            desc=f"epoch {epoch + 1}",
            disable=not self.show_progress,
        ):
            started = time.perf_counter()
            images, labels = images.to(self.device), labels.to(self.device)
            loss = prediction_loss(self.synchronizer.forward_model(images), labels)
            self.optimizer.zero_grad()
            loss.backward()
            position = f"epoch {epoch + 1}, iteration {before + done + meter.iterations + 1}"
            computed, synchronized, exposed, sync_seconds, value = self._synchronize(loss, position)
            last_lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.scheduler.step()
            outer = self.synchronizer.after_step()  # local SGD's outer step: exposed
            sync_seconds, exposed = sync_seconds + outer, exposed + outer
            if outer:  # overlapped, its whole synchronization ran on the communication thread
                sync_seconds = max(sync_seconds, self.synchronizer.stats["sync_seconds"])
            self.global_step += 1
            ran = done + meter.iterations + 1  # this run's iterations of the epoch
            if (
                self.checkpoint_every
                and self.global_step % self.checkpoint_every == 0
                and ran < iterations
            ):  # the epoch's last iteration saves the epoch's checkpoint
                samples = self.epoch_samples + ran * self.global_batch
                self._save(Position(epoch, before + ran), samples)
            meter.add_step(
                value,
                predictions(labels),
                computed - started,
                sync_seconds,
                self.synchronizer.stats,
                exposed,
            )
            if (
                self.eval_every
                and self.global_step % self.eval_every == 0
                and meter.iterations < iterations - done
            ):  # an evaluation within the epoch (the epoch's last iteration logs its own row)
                done += meter.iterations
                self._log_row(meter, last_lr, epoch + 1, within=True)
                self.model.train()
                self.comm.Barrier()  # the next row's clock starts together, as an epoch's
                meter = EpochMeter()
            if self.progress_lines and synchronized - last_line >= PROGRESS_SECONDS:
                last_line = synchronized
                finished = done + meter.iterations
                print(
                    f"epoch {epoch + 1}: {finished}/{iterations} iterations, "
                    f"{(synchronized - epoch_start) / finished * 1e3:.0f} ms each, "
                    f"loss {value:.4f}",
                    flush=True,
                )
        return meter, last_lr

    def _synchronize(self, loss, position):
        """Average the step's gradients (the synchronizer's ``finish``, which calls the agreement
        on stopping once) and clip where the flags say; return ``(compute end, sync end,
        exposed sync seconds, sync seconds, loss value)``. The agreement's time counts in
        neither compute nor synchronization."""
        clips_average = self.synchronizer.overlaps_backward  # else each worker clips its own
        if self.clip_grad_norm and not clips_average:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        computed = self._now()
        value = loss.item()
        agreeing = 0.0

        def agree(gradient=None, finite=True):
            nonlocal agreeing
            started = self._now()
            self._agree(position, value, gradient, finite)
            agreeing += self._now() - started

        self.synchronizer.finish(agree)
        if self.clip_grad_norm and clips_average:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        synchronized = self._now()
        stats = self.synchronizer.stats
        # DDP and FSDP wait for their buckets inside backward: compute ended earlier.
        computed = min(computed, stats["compute_end"] or computed)
        exposed = synchronized - computed - agreeing
        return computed, synchronized, exposed, max(stats["sync_seconds"], exposed), value

    def _agree(self, position, loss=0.0, gradient=None, finite=True):
        """Raise ``Stopped`` on every rank if any rank was interrupted, or its ``loss`` or
        ``gradient`` is not finite, or ``finite`` is False: an overlapped average that is not
        (the same on every rank). Collective; ``position`` names the step."""
        interrupted, bad_loss, bad_gradient = agree_flags(
            self.comm, self.interrupt.requested, loss, gradient
        )
        bad_gradient = bad_gradient or not finite
        # Every rank got here, so every rank has finished writing its checkpoints.
        self.position, self.complete_epoch = position, self.saved_epoch
        if bad_loss or bad_gradient:
            what = (
                f"the training loss is {loss}"
                if not math.isfinite(loss)
                else "the training loss is not finite on another worker"
                if bad_loss
                else "the gradient holds NaN or inf"
            )
            raise Stopped(
                f"error: the run diverged at {position}: {what} (a lower --lr, or more "
                "--warmup-epochs?)",
                DIVERGED,
            )
        if interrupted:
            raise Stopped(self.interrupted_line(), INTERRUPTED)

    def interrupted_line(self):
        """What to say when interrupted now: where, and the newest checkpoint every rank has."""
        where = f"at {self.position}" if self.position else "before training started"
        last = (
            f"the last checkpoint is {self.checkpoints.path(self.complete_epoch).parent}"
            if self.complete_epoch is not None
            else "no checkpoint was written"
        )
        return f"interrupted {where}; {last}"

    def _now(self):
        """Wall time after the device finished its queued work (so phases are timed right)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def state_dict(self, epoch_samples=0):
        """Everything this rank needs to continue bit-identically after the current epoch, or
        within the next one ``epoch_samples`` samples into its permutation (collective under
        FSDP, which gathers the model's and the optimizer's shards)."""
        model_state, optimizer_state = self.synchronizer.training_state(self.model, self.optimizer)
        return {
            "epoch": self.epoch,
            "epoch_samples": epoch_samples,
            "global_step": self.global_step,
            "nworkers": self.comm.Get_size(),
            "batch_size": getattr(self.train_loader, "batch_size", None),
            "run_info": self.run_info,
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            "synchronizer": self.synchronizer.state_dict(),
            "rng": rng_state(),
        }

    def load_state_dict(self, state, position=None):
        """Continue from a ``state_dict`` of the same model and data, read from the checkpoint
        at ``position`` (a :class:`~trainer.checkpoint.Position`; default its epoch's end).

        Within an epoch (``epoch_samples``) the data goes on from that sample of the epoch's
        permutation, whatever the world size; a state without random generators (``rng``
        ``None``: another world size) leaves them as the caller seeded them.

        The optimizer keeps its saved momentum buffers but this run's hyper-parameters (learning
        rate, momentum, weight decay), and the schedule is this run's, placed at the start of
        epoch ``state["epoch"] + 1``: with unchanged flags that is exactly the saved state, with
        changed ones (``--lr``, ``--lr-milestones``, ``--max-iters``, ...) the new flags hold.
        """
        hyper = [
            {key: value for key, value in group.items() if key != "params"}
            for group in self.optimizer.param_groups
        ]
        self.synchronizer.load_training_state(
            self.model, self.optimizer, state["model"], state["optimizer"]
        )
        for group, settings in zip(self.optimizer.param_groups, hyper):
            group.update(settings)
        self.synchronizer.load_state_dict(state["synchronizer"])
        self.epoch = state["epoch"]
        self.epoch_samples = int(state.get("epoch_samples", 0))
        self.global_step = state["global_step"]
        if state.get("rng") is None:  # another world size: resume() seeded the generators
            pass
        elif self.epoch_samples:  # once the resumed epoch's batches are drawn
            self.pending_rng = state["rng"]
        else:
            restore_rng(state["rng"])
        if self.checkpoints is not None:  # every rank read this checkpoint
            self.saved_epoch = self.complete_epoch = position or Position(self.epoch)
        step = self.scheduler.last_epoch = (
            self.epoch * self.iters_per_epoch + self.epoch_samples // self.global_batch
        )
        for group, base, factor in zip(
            self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas
        ):
            group["lr"] = base * factor(step)  # what LambdaLR sets at that step
