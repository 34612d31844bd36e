"""The training progress bar: Lightning's own (rich where installed, else tqdm, as Lightning picks), showing the
step loss of the last log.

A loss logged to the bar with ``self.log(..., prog_bar=True)`` was a tensor the bar read back every step: on a GPU
a host sync per step, which left the device idle while Python set up the next step. The bar now shows
``LitGPT.logged_loss``, a float read at each log (every ``train.log_every`` steps), where the module reads the
device anyway.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class _LastLoss:
    """Adds ``loss``, the module's ``logged_loss`` (None before the first log), to the bar's metrics."""

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "logged_loss", None)
        if loss is not None:
            metrics["loss"] = round(loss, 3)
        return metrics


class _RichBar(_LastLoss, RichProgressBar):
    pass


class _TqdmBar(_LastLoss, TQDMProgressBar):
    pass


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
