"""The LightningModule: holds a GPT, computes the loss, owns the optimizer and the schedule. Nothing else.

One module instance trains one phase (phases.py builds a new one per phase around the same GPT, so weights
carry over and the schedule restarts). Scalars go to TensorBoard on the run's continuous step axis:
``step_offset`` (the optimizer steps of earlier phases) + this phase's ``global_step``.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import Optional

import lightning as L
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from torch import nn

from minilm.cli import raise_if_interrupted, sigterm_without_collective
from minilm.config import key_as_set
from minilm.data import IGNORE
from minilm.errors import MinilmError
from minilm.training.checkpoint import atomic_torch_save, load_checkpoint_dict
from minilm.training.compile import compiled
from minilm.training.datamodule import STEP_TARGETS
from minilm.training.optim import check_optimizer_params, make_adamw, param_groups, param_names


def lr_lambda(step: int, warmup: int, total: int, decay: str, min_ratio: float) -> float:
    """Multiplier of the peak lr: linear warmup over ``warmup`` steps, then cosine / linear decay to
    ``min_ratio`` at ``total``, or constant."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * shape


def _per_target(total: torch.Tensor, targets) -> torch.Tensor:
    """A summed token loss over its number of targets (a tensor, or an int)."""
    return total / (targets.clamp(min=1) if torch.is_tensor(targets) else max(1, targets))


def _bad_step_text(norm: float, loss: float) -> str:
    """What went wrong in a step whose gradient norm is not finite: its loss, if that is not finite either."""
    return f"the gradient norm became {norm}" if math.isfinite(loss) else f"the loss became {loss}"


class AtomicCheckpointIO(CheckpointIO):
    """Lightning CheckpointIO: atomic torch.save, weights_only torch.load (minilm.training.checkpoint)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        atomic_torch_save(checkpoint, Path(path))

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return load_checkpoint_dict(Path(path), map_location or "cpu")

    def remove_checkpoint(self, path) -> None:
        Path(path).unlink(missing_ok=True)


class LitGPT(L.LightningModule):
    def __init__(self, model: nn.Module, cfg, total_steps: int, step_offset: int = 0, phase: str = "train",
                 tokens_offset: int = 0, started_from: Optional[dict] = None, set_in=None):  # fmt: skip
        """``cfg`` is the phase's resolved config (minilm.config.phase_config); ``set_in``: the phase's own section of
        the run's config (``cfg.phases.get(phase)``), so that advice names the key the user sets (phases.P.lr, not
        an optim.lr the phase overrides: ``key_as_set``); ``tokens_offset``: the tokens the
        earlier phases trained on (their batch_size · seq_len may differ from this phase's); ``started_from``: the
        weights the phase started from (minilm.training.run_checks.started_from_record), kept in its checkpoints: a
        resumed phase continues from a checkpoint, and what the phase started from is the checkpoint's record."""
        super().__init__()
        self.model, self.cfg = model, cfg
        self.total_steps, self.step_offset, self.phase = total_steps, step_offset, phase
        self.set_in = set_in
        self.tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
        self.tokens_offset = tokens_offset
        # train.compile compiles the loss (what a step calls), not the module: a compiled module's .loss attribute
        # would be the eager method.
        if cfg.train.compile:
            # Each phase compiles afresh. Dynamo's cache for GPT.loss would otherwise keep every earlier phase's
            # graphs (other lengths and batch sizes; train and eval), and past its recompile limit (8) it runs the
            # loss eagerly without an error: the third phase of configs/rope_yarn_tiny.yaml did.
            torch._dynamo.reset()
        self.loss_fn = compiled(model.loss, cfg.train) if cfg.train.compile else model.loss
        self.initial_optimizer_state: Optional[dict] = None  # carried from the previous phase (carry_optimizer)
        self.bad_steps = 0
        self.last_grad_norm = float("nan")
        # (run step, gradient norm, summed loss, targets) of each optimizer step the fused AdamW was told to skip
        # or not on the device, not yet read on the host (settle_bad_steps)
        self._unsettled: list[tuple] = []
        self._step_lr = float("nan")  # the lr the last optimizer step used (the scheduler moves on before logging)
        # the summed token losses and the number of targets of the current optimizer step on this rank
        self._loss_sum: Optional[torch.Tensor] = None
        self._loss_count = 0
        self._step_targets: Optional[torch.Tensor] = None  # the step's targets on every rank together
        self._t_last: Optional[float] = None  # time and step of the last tokens_per_sec measurement
        self._step_last = 0
        self._t_val: Optional[float] = None
        self._paused = 0.0  # seconds spent validating since the last measurement: not training throughput
        self._val_losses: list[torch.Tensor] = []  # (summed token loss, targets) of each validation micro-batch
        self.last_val_step: Optional[int] = None  # this phase's step of the last validation
        self._ended_step: Optional[int] = None  # the last step ``end_step`` logged
        self.logged_loss: Optional[float] = None  # train/loss at the last log
        # the phase's training time: this module's, and the one the checkpoint it resumed from recorded (a resumed
        # phase's summary counted the seconds since the resume alone: "finished in 2s" after an hour's training)
        self._t_built = time.perf_counter()
        self.seconds_before = 0.0
        self.started_from = started_from

    # ------------------------------------------------------------------------------------------- steps

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        """Seed torch's generator (dropout) from (seed, phase, micro-step, rank), as the sampler seeds the data:
        the global generator is also drawn from by Lightning's data loaders (one number per loader iterator, so a
        resumed fit and every validation shift it), so a restored generator state alone does not make a resumed
        or restarted phase draw the masks of an uninterrupted run; a pure function of the step does."""
        accum = self.trainer.accumulate_grad_batches
        micro_step = self.global_step * accum + batch_idx % accum
        key = f"{self.cfg.run.seed}/{self.phase}/{micro_step}/{self.global_rank}"
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 2**63
        # The generators a step draws from, the CPU's and the model's device's, not torch.manual_seed's every
        # backend: one not initialized (CUDA in a CPU run, XPU, MTIA) formats a stack trace per call to keep for
        # later: 1.4 of the 7.9 ms of host time per step of a 1-layer model's fit on the development CPU.
        torch.default_generator.manual_seed(seed)
        if self.device.type != "cpu":
            torch.get_device_module(self.device.type).manual_seed(seed)

    def _loss(self, batch: dict, reduction: str = "mean") -> torch.Tensor:
        return self.loss_fn(
            batch["input_ids"], batch["targets"], positions=batch.get("positions"), doc_ids=batch.get("doc_ids"),
            reduction=reduction,
        )  # fmt: skip

    def training_step(self, batch: dict, batch_idx: int):
        # The step's loss is the mean over all its targets, on every rank and in every micro-batch: DDP averages the
        # ranks' gradients and Lightning divides each micro-batch's loss by their number, so a micro-batch's summed
        # loss is scaled by (ranks · micro-batches / the step's targets). A mean per micro-batch weighed a row by
        # 1 / (its micro-batch's targets): where rows differ in targets (synthetic rows trained on their answer
        # alone), 2 devices x 2 rows, or micro_batch_size, trained otherwise than 1 device x 4 rows.
        accum = self.trainer.accumulate_grad_batches
        targets = (batch["targets"] != IGNORE).sum()  # a tensor: no host sync per micro-batch
        if batch_idx % accum == 0 or self._step_targets is None:  # the first micro-batch: one count per step
            # (PhaseData's batches carry their step's count; other rows are taken for micro-batches alike)
            given = batch.get(STEP_TARGETS)
            # (torch.full: a fill on the device; torch.tensor(x, device) would copy from the host and wait for it)
            mine = targets * accum if given is None else torch.full((), float(given), device=targets.device)
            self._step_targets = self.trainer.strategy.reduce(mine.float(), reduce_op="sum")
        total = self._loss(batch, reduction="sum")
        loss = total * (self.trainer.world_size * accum) / self._step_targets.clamp(min=1)
        # A non-finite loss is not skipped here (returning None) but through its gradient, in
        # on_before_optimizer_step: under DDP the all-reduce spreads it to every rank, so all ranks skip the same
        # step (one rank skipping its backward alone would leave the others waiting in the all-reduce). No host
        # sync per micro-batch either.
        # With gradient accumulation a step is several micro-batches: its logged loss is the mean over all their
        # targets (over every rank at a log: end_step), not the last micro-batch's.
        self._loss_sum = total.detach() if self._loss_sum is None else self._loss_sum + total.detach()
        self._loss_count = self._loss_count + targets
        return loss

    def _bad_step(self, what: str, step: int) -> None:
        """Count a skipped step (``train.max_bad_steps``; ``step`` on the run's axis), or stop the phase once there
        are too many."""
        self.bad_steps += 1
        # (after earlier phases, the run's step alone read as beyond the phase: "at step 6" of a 2-step phase)
        at = f"step {step}" + (f" (the phase's step {step - self.step_offset} of {self.total_steps})"
                               if self.step_offset else "")  # fmt: skip
        if self.bad_steps > self.cfg.train.max_bad_steps:
            lr, warmup = (key_as_set(k, self.phase, self.set_in) for k in ("optim.lr", "optim.warmup_steps"))
            raise MinilmError(
                f"phase '{self.phase}': {what} at {at}; stopping (no bad step changed the weights: a checkpoint the "
                f"phase wrote holds good steps only). Lower {lr}, raise {warmup}, or allow skipping with "
                "train.max_bad_steps."
            )
        if self.global_rank == 0:  # every DDP rank skips the step alike (the norm is of the all-reduced gradient)
            print(f"warning: {what} at {at}; skipped ({self.bad_steps}/{self.cfg.train.max_bad_steps})")

    def _step_loss(self, loss_sum: torch.Tensor, count) -> float:
        """A step's loss, the mean over the ranks: a collective, so every rank calls it alike (they do: a bad step is
        decided on the norm of the all-reduced gradient)."""
        return float(self.trainer.strategy.reduce(_per_target(loss_sum, count), reduce_op="mean"))

    def _skips_on_device(self, optimizer) -> bool:
        """Whether a bad step is skipped by the fused AdamW kernel itself (its ``found_inf``, the flag GradScaler
        sets), with no host read of the norm: the fused optimizer, and no fp16 GradScaler (that one sets the flag)."""
        return bool(optimizer.defaults.get("fused")) and self.trainer.precision != "16-mixed"

    def on_before_optimizer_step(self, optimizer) -> None:
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        self._step_lr = optimizer.param_groups[0]["lr"]  # read before the scheduler steps to the next step's lr
        # A NaN/inf loss, or a finite loss with a NaN/inf gradient: clipping would write NaN into every weight (it
        # scales by clip / norm). The norm is of the all-reduced gradient, so every rank decides alike.
        step = self.step_offset + self.global_step + 1  # as logged: global_step counts this step only after it
        if self._skips_on_device(optimizer):
            # Decided on the device, read at the next log (settle_bad_steps): a host read of the norm here waited
            # for the backward each step, leaving the GPU idle while Python set up the next one. With found_inf 1
            # the kernel leaves weights, moments and step count as they were.
            optimizer.found_inf = (~torch.isfinite(norm.detach())).float()
            self._unsettled.append((step, norm.detach(), self._loss_sum, self._loss_count))
            return
        self.last_grad_norm = float(norm)
        if not math.isfinite(self.last_grad_norm):
            loss = self._step_loss(self._loss_sum, self._loss_count)
            if math.isfinite(loss) and self.trainer.precision == "16-mixed":
                return  # fp16's GradScaler skips overflowing steps itself (and lowers its scale)
            self._bad_step(_bad_step_text(self.last_grad_norm, loss), step)
            for p in self.model.parameters():
                p.grad = None  # AdamW leaves a parameter without a gradient untouched: the step is skipped

    def settle_bad_steps(self) -> None:
        """Read the gradient norms of the steps since the last call (one host read for them all): count and warn
        of each skipped one, or stop the phase once there are too many. At each log, before a checkpoint (which
        holds the count), and at the end of the phase; a stop comes at most ``train.log_every`` steps late, its
        skipped steps having changed nothing."""
        if not self._unsettled:
            return
        unsettled, self._unsettled = self._unsettled, []
        norms = torch.stack([norm for _, norm, _, _ in unsettled]).tolist()
        self.last_grad_norm = norms[-1]
        for (step, _, loss_sum, count), norm in zip(unsettled, norms):
            if not math.isfinite(norm):
                self._bad_step(_bad_step_text(norm, self._step_loss(loss_sum, count)), step)

    def on_train_end(self) -> None:
        self.settle_bad_steps()  # a fit stopped between logs (its last step logs)

    def on_train_start(self) -> None:
        sigterm_without_collective(self.trainer.world_size)
        self._t_last, self._step_last, self._paused = time.perf_counter(), self.global_step, 0.0

    def on_validation_start(self) -> None:
        sigterm_without_collective(self.trainer.world_size)  # (also a validate() run of its own)
        self._t_val = time.perf_counter()

    def on_validation_end(self) -> None:
        if self._t_val is not None:
            self._paused += time.perf_counter() - self._t_val
            self._t_val = None

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.end_step(batch_idx)
        raise_if_interrupted()  # a Ctrl-C lost where it arrived (in a finalizer) stops the phase here

    def end_step(self, batch_idx: int) -> None:
        """At an optimizer step's last micro-batch: log its scalars, once. The run's checkpoint callback calls it
        before it writes the step's checkpoint (Lightning runs the callbacks' batch end before this module's): a
        kill between the two left the checkpoint without the step's points, which the resumed run does not log."""
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches or self._ended_step == self.global_step:
            return
        self._ended_step = self.global_step
        loss_sum, count = self._loss_sum, self._loss_count  # every micro-batch adds to them: not None
        self._loss_sum, self._loss_count = None, 0  # the next optimizer step starts its own mean
        step = self.global_step  # already incremented by the optimizer step
        if step % self.cfg.train.log_every and step != self.total_steps:
            return
        if self.trainer.world_size > 1:  # the mean over the global batch's targets, as the step trained on (rank
            # 0's rows alone drew another curve than one process with the same global batch): one all-reduce per
            # log, which every rank reaches at the same step
            loss_sum, count = self.trainer.strategy.reduce(
                torch.stack([loss_sum.float(), torch.as_tensor(count, device=loss_sum.device).float()]),
                reduce_op="sum")  # fmt: skip
        # The host reads of a log, the only ones in a training step: before the clock, which then times the steps
        # the device has finished (the host runs ahead of it between logs)
        loss = self.logged_loss = float(_per_target(loss_sum, count))  # (also the progress bar's: progress.py)
        self.settle_bad_steps()
        now = time.perf_counter()
        scalars = {
            "train/loss": loss,
            "lr": self._step_lr,
            "grad_norm": self.last_grad_norm,
            "tokens_seen": float(self.tokens_offset + step * self.tokens_per_step),
        }
        if self._t_last is not None and step > self._step_last:
            # the steps since the last measurement (fewer than log_every at a phase's last step), validation excluded
            seconds = now - self._t_last - self._paused
            scalars["tokens_per_sec"] = (step - self._step_last) * self.tokens_per_step / max(1e-9, seconds)
        self._t_last, self._step_last, self._paused = now, step, 0.0
        self.log_scalars(scalars)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        targets = (batch["targets"] != IGNORE).sum().to(torch.float32)
        self._val_losses.append(torch.stack([self._loss(batch, reduction="sum").detach().float(), targets]))

    def on_validation_epoch_end(self) -> None:
        if not self._val_losses:
            return
        # the mean over every target of every rank's rows (as for a training step): not of the micro-batches' or
        # ranks' means, which differ where rows differ in targets
        total, targets = self.trainer.strategy.reduce(torch.stack(self._val_losses).sum(0), reduce_op="sum")
        loss = total / targets.clamp(min=1)
        self._val_losses.clear()
        # (already the mean over the ranks: sync_dist averages equal values, and keeps Lightning from telling every
        # DDP run to "use sync_dist=True")
        self.log("val_loss", loss, prog_bar=True, logger=False, sync_dist=True)
        self.last_val_loss, self.last_val_step = float(loss), self.global_step
        if not self.trainer.sanity_checking:
            self.log_scalars({"val/loss": float(loss), "val/ppl": math.exp(min(float(loss), 50.0))})

    def log_scalars(self, scalars: dict) -> None:
        """Write to TensorBoard at the run's continuous step (rank 0 only)."""
        if self.logger is None or self.trainer.global_rank != 0:
            return
        step = self.step_offset + self.global_step
        for tag, value in scalars.items():
            self.logger.experiment.add_scalar(tag, value, global_step=step)

    # --------------------------------------------------------------------------------------- optimizer

    def optimizer_params(self) -> list[str]:
        """The names of the parameters the optimizer's state is indexed by, in that order (saved with it)."""
        return param_names(self.model, param_groups(self.model, self.cfg.optim.weight_decay))

    def configure_optimizers(self):
        o = self.cfg.optim
        opt = make_adamw(self.model, o)
        if self.initial_optimizer_state is not None:  # moments from the previous phase (checked against this model
            # by minilm.training.phases._carried_optimizer_state); this phase's lr settings
            state = opt.state_dict()
            state["state"] = self.initial_optimizer_state["state"]
            opt.load_state_dict(state)
        warmup, total = o.warmup_steps, self.total_steps
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_lambda(s, warmup, total, o.decay, o.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def phase_seconds(self) -> float:
        """Seconds the phase has trained: since this module was built, plus those before the checkpoint it resumed
        from (the steps a kill cut short after that checkpoint, trained again, count once)."""
        return self.seconds_before + time.perf_counter() - self._t_built

    # ----------------------------------------------------------------------------- exact-resume state

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.settle_bad_steps()  # the count it holds
        checkpoint["minilm"] = {
            "phase": self.phase,
            "step_offset": self.step_offset,
            "bad_steps": self.bad_steps,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "optimizer_params": self.optimizer_params(),
            "seconds": self.phase_seconds(),
            "started_from": self.started_from,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("minilm", {})
        if state.get("phase", self.phase) != self.phase:
            raise MinilmError(f"checkpoint belongs to phase '{state['phase']}', not '{self.phase}'")
        if checkpoint.get("optimizer_states"):  # (before Lightning loads it: torch's own error names no file)
            sizes = [len(g["params"]) for g in checkpoint["optimizer_states"][0]["param_groups"]]
            check_optimizer_params({"names": state.get("optimizer_params"), "sizes": sizes}, self.model,
                                   self.cfg.optim.weight_decay, f"the checkpoint of phase '{self.phase}'",
                                   f"retrain the phase from the previous one's weights with --phase {self.phase} (and "
                                   f"phases.{self.phase}.carry_optimizer=false if it carries moments of that older "
                                   "minilm), or continue it with the minilm that wrote it")  # fmt: skip
        self.bad_steps = state.get("bad_steps", 0)
        self.seconds_before = float(state.get("seconds", 0.0))  # (none: a checkpoint from before it was saved)
        self.started_from = state.get("started_from")  # (None: not recorded, a checkpoint from before it was saved)
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
