"""The training progress bar: Lightning's own (rich where installed, else tqdm, as Lightning picks), counting
optimizer steps and showing the step loss of the last log.

Lightning's bar counts the loader's batches, which under gradient accumulation (``train.batch_size`` over
``train.micro_batch_size``) are micro-batches: a phase of 100 steps of 4 micro-batches showed a bar of 400, where
``train.steps``, every log line and TensorBoard count optimizer steps. The bar's total (``total_train_batches``, the
property Lightning's bars read it from) and its counter (the index each bar's batch end shows) are converted to
steps, and the bar moves once per step, at its last micro-batch. The validation bar alike: the validation loader
splits each of its ``train.val_batches`` batches into the same micro-batches (minilm.training.datamodule), and its
bar showed 32/32 for ``val_batches: 8`` of 4 micro-batches; it counts validation batches.

A loss logged to the bar with ``self.log(..., prog_bar=True)`` was a tensor the bar read back every step: on a GPU
a host sync per step, which left the device idle while Python set up the next step. The bar now shows
``LitGPT.logged_loss``, a float read at each log (every ``train.log_every`` steps), where the module reads the
device anyway.
"""

from __future__ import annotations

import math

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class _Steps:
    """Counts optimizer steps: Lightning's total and counter of micro-batches, divided by the micro-batches a step
    takes (``trainer.accumulate_grad_batches``; a phase's loader holds whole steps: minilm.training.datamodule). A
    resumed phase's batch index counts from the phase's first micro-batch (Lightning restores its position in them),
    so the bar goes on from the step the checkpoint was written at."""

    @property
    def total_train_batches(self):
        total = super().total_train_batches
        return total if math.isinf(total) else total // self.trainer.accumulate_grad_batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        done = (batch_idx + 1) // trainer.accumulate_grad_batches  # optimizer steps done, this micro-batch's included
        super().on_train_batch_end(trainer, pl_module, outputs, batch, done - 1)  # (the bar shows batch_idx + 1)

    # Validation: the loader holds whole batches of accumulate_grad_batches micro-batches each (PhaseData splits
    # every validation batch as it splits a step). Not the sanity check's, which takes num_sanity_val_steps
    # micro-batches, not whole batches (minilm's trainer runs none).
    @property
    def total_val_batches_current_dataloader(self):
        return self._batches(super().total_val_batches_current_dataloader)

    @property
    def total_val_batches(self):
        return self._batches(super().total_val_batches)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0):
        if not trainer.sanity_checking:
            batch_idx = (batch_idx + 1) // trainer.accumulate_grad_batches - 1  # whole batches done, less one
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def _batches(self, micro_batches):
        if self.trainer.sanity_checking or math.isinf(micro_batches):
            return micro_batches
        return micro_batches // self.trainer.accumulate_grad_batches


class _LastLoss:
    """Adds ``loss``, the module's ``logged_loss`` (None before the first log), to the bar's metrics."""

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "logged_loss", None)
        if loss is not None:
            metrics["loss"] = round(loss, 3)
        return metrics


class _RichBar(_Steps, _LastLoss, RichProgressBar):
    pass


class _TqdmBar(_Steps, _LastLoss, TQDMProgressBar):
    def get_metrics(self, trainer, pl_module) -> dict:
        """Numbers with three decimals, as the rich bar writes them: Lightning's tqdm bar writes three significant
        digits padded with zeros, so a loss of 7.5678 read 7.570 and one of 12.3456 read 12.30, and a loss falling
        in its second decimal looked as if it stood still."""
        metrics = super().get_metrics(trainer, pl_module)
        return {k: f"{v:.3f}" if isinstance(v, float) else v for k, v in metrics.items()}

    def init_train_tqdm(self):
        """With its total: Lightning sets it when an epoch starts, which a resumed phase does not (it resumes within
        its one epoch), and the bar showed 'steps/?'."""
        bar = super().init_train_tqdm()
        total = self.total_train_batches
        bar.total = None if math.isinf(total) else total
        return bar


def _rich_bar_breaks() -> bool:
    """Lightning before 2.5.3 pops rich's live stack at every stage start without looking, and from rich 14.1 the
    stack is empty there: the first validation raised IndexError (lightning 2.4.0 with rich 15.0.0)."""
    from importlib.metadata import version

    import lightning
    from packaging.version import Version

    return Version(lightning.__version__) < Version("2.5.3") and Version(version("rich")) >= Version("14.1")


def progress_bar():
    """The bar for ``L.Trainer(callbacks=[...])``: rich's where the package is there (it raises otherwise) and
    works with this Lightning, else tqdm's."""
    try:
        bar = _RichBar()
    except ModuleNotFoundError:
        return _TqdmBar()
    return _TqdmBar() if _rich_bar_breaks() else bar
