"""Plot logged metrics per training step to a PNG in the run's folder at the end of fit."""

from __future__ import annotations

import os
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override


class MetricsPlot(Callback):
    """Records ``metrics`` from ``trainer.callback_metrics`` after every training batch and writes
    one panel per metric to ``<run folder>/<filename>`` when fit ends (and at every checkpoint
    load the history comes back, so a resumed run plots the whole curve).

    The run folder is the first logger's ``log_dir`` when it has one (the ``version_N`` folder of
    ``CSVLogger`` / ``TensorBoardLogger``), else that logger's ``save_dir``, else (no logger)
    ``trainer.default_root_dir``. Under ``fast_dev_run`` nothing is written: Lightning's smoke
    mode promises no side effects (its loggers are replaced by a dummy with no folder).

    Args:
        metrics: logged keys to plot, e.g. ``["reward/mean", "rollout/response_length"]``.
        filename: PNG name inside the run folder.
        smoothing: window of the moving average drawn over each raw curve (1 = off).
    """

    def __init__(
        self,
        metrics: list[str] | None = None,
        filename: str = "metrics.png",
        smoothing: int = 5,
    ) -> None:
        if smoothing < 1:
            raise ValueError(f"smoothing must be >= 1, got {smoothing}")
        self.metrics = metrics or ["reward/mean"]
        self.filename = filename
        self.smoothing = smoothing
        self.history: dict[str, list[float]] = {m: [] for m in self.metrics}
        self.path: str | None = None

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for name in self.metrics:
            value = trainer.callback_metrics.get(name)
            if value is not None:
                self.history[name].append(float(value))

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Trainer sets fast_dev_run in __init__ without declaring it, hence getattr (for mypy)
        if getattr(trainer, "fast_dev_run", False):
            rank_zero_info(f"MetricsPlot: fast_dev_run, so {self.filename} is not written")
            return
        # Only rank 0 writes, and only rank 0 asks for the folder: the logger's own properties
        # are local reads. (trainer.log_dir instead broadcasts rank 0's folder: if it is used,
        # every rank must ask, or multi-process runs (DDP, DeepSpeed) hang at the end of fit.)
        if trainer.is_global_zero:
            self._write(_run_folder(trainer))

    def _write(self, folder: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(self.metrics), 1, figsize=(7, 2.6 * len(self.metrics)))
        axes_list = axes if len(self.metrics) > 1 else [axes]
        for ax, name in zip(axes_list, self.metrics, strict=True):
            ys = self.history[name]
            ax.plot(range(1, len(ys) + 1), ys, alpha=0.4, label="per step")
            k = min(self.smoothing, len(ys))
            if k > 1:
                smooth = [
                    sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1])
                    for i in range(len(ys))
                ]
                ax.plot(range(1, len(ys) + 1), smooth, label=f"mean of last {k}")
            ax.set_ylabel(name)
            ax.legend(loc="best", fontsize=8)
        axes_list[-1].set_xlabel("rollout step")
        fig.tight_layout()
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, self.filename)
        fig.savefig(self.path, dpi=100)
        plt.close(fig)
        rank_zero_info(f"MetricsPlot: wrote {self.path}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {m: list(state_dict["history"].get(m, [])) for m in self.metrics}


def _run_folder(trainer: Trainer) -> str:
    """This process's folder for the run's files: the first logger's ``log_dir`` (a
    ``version_N`` folder), else its ``save_dir``, else ``trainer.default_root_dir``."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        folder = getattr(logger, "log_dir", None) or logger.save_dir
        if folder:
            return str(folder)
    return trainer.default_root_dir
