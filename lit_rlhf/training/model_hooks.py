"""The Lightning hooks of a module that trains one Hugging Face model with one optimisation step
and exports it at the end of ``fit`` (SFT, the Bradley-Terry reward model)."""

from __future__ import annotations

from typing import Any

from lightning import Callback

from lit_rlhf.models.checkpoint_weights import check_checkpoint_weights
from lit_rlhf.plan.check import check_memory
from lit_rlhf.settings import PrecisionSettings
from lit_rlhf.training.completions import CompletionTable
from lit_rlhf.training.export import export_pretrained
from lit_rlhf.training.loader_position import EpochEndLoaderReset
from lit_rlhf.training.precision import check_trainable_precision
from lit_rlhf.training.progress import PlainProgress
from lit_rlhf.training.rng import GlobalRNGState
from lit_rlhf.training.run_checkpoint import UnloggedRow


class ExportedModelHooks:
    """Mixin for a LightningModule with ``model``, ``tokenizer``, ``step_optimizer`` (an
        :class:`~lit_rlhf.training.OptimizerStep`) and the hyperparameters ``model`` and
        ``export_dir``: exact resumes (the global generators, a fresh loader after an epoch-end
        checkpoint), the optimisation step's counters in the checkpoint, a checkpoint of another
        base model refused naming both, ``precision.dtype`` checked against the strategy before
    any weights load, and the export at the end of ``fit``."""

    model: Any
    tokenizer: Any
    step_optimizer: Any
    precision: PrecisionSettings
    trainer: Any
    hparams: Any

    @property
    def hp(self) -> Any:
        return self.hparams

    def setup(self, stage: str) -> None:
        if stage == "fit":  # the strategy is known and no weights are loaded yet
            check_trainable_precision(self.trainer, {"precision.dtype": self.precision.dtype})
            check_memory(self)  # the memory plan on CUDA (precision.memory_check)

    def configure_callbacks(self) -> list[Callback]:
        return module_callbacks()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.step_optimizer.save_to(checkpoint)  # skip counts, lr schedule counters

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_checkpoint_weights(self, checkpoint, settings=("model",))  # type: ignore[arg-type]
        self.step_optimizer.load_from(checkpoint)

    def on_fit_end(self) -> None:
        export_pretrained(self.trainer, self.model, self.tokenizer, self.hparams.export_dir)


def module_callbacks() -> list[Callback]:
    """The callbacks every lit-rlhf module returns from ``configure_callbacks``: exact resumes
    (the global generators; a fresh loader after an epoch-end checkpoint, the loader position at
    another world size), plain progress lines (one per 5 s at most) when stdout is not a
    terminal, the completions table of a step that returns one (``rollout.log_completions``),
    and the pending metrics row in every checkpoint, whichever callback saves it
    (:class:`UnloggedRow`)."""
    return [GlobalRNGState(), EpochEndLoaderReset(), PlainProgress(), CompletionTable(),
            UnloggedRow()]  # fmt: skip
