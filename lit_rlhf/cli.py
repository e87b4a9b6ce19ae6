"""``lit-rlhf fit|validate|test --config ...``: one LightningCLI for every module and DataModule.

Every cross-component link lives here:
- ``data.tokenizer`` (the DataModule's loaded tokenizer) -> ``model.init_args.tokenizer``, for
  modules whose ``__init__`` takes a ``tokenizer``. For any other LightningModule jsonargparse
  skips the link, as it does every instantiation link whose target is not among the chosen
  class's init args (tests/test_cli.py).

The optimizer comes from each module's settings (``lr``, ``weight_decay``, ...): LightningCLI's
``--optimizer`` / ``--lr_scheduler`` are not offered (a module with manual optimisation would
ignore the one and never step the other).

With ``--ckpt_path``, LightningCLI replaces the config's model settings by the checkpoint's saved
hyperparameters. lit-rlhf keeps that for ``fit`` (a resume continues the run it resumes) and
warns about every setting of the config it overrides; for ``validate``, ``test`` and ``predict``
the config's settings win (the checkpoint gives the weights: evaluate a trained judge with
another ``inference``), with a warning naming the settings that differ from the checkpoint's.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from lightning import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_rlhf.strategies.shutdown import shutdown_distributed

_EVALUATE = ("validate", "test", "predict")


class LitRLHFCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        init = self.config[subcommand].get("model.init_args") if subcommand else None
        if init is None:
            return super()._parse_ckpt_path()
        before = init.clone()
        super()._parse_ckpt_path()
        after = self.config[subcommand]["model.init_args"]
        changed = sorted(
            key for key in set(before.keys()) | set(after.keys())
            if key != "tokenizer" and before.get(key) != after.get(key)
        )  # fmt: skip
        if not changed:
            return
        pairs = ", ".join(
            f"{k}: config {before.get(k)!r}, checkpoint {after.get(k)!r}" for k in changed
        )
        if subcommand in _EVALUATE:
            for key in changed:
                after[key] = before.get(key)
            warnings.warn(
                f"{subcommand} with --ckpt_path: the checkpoint's weights with the config's "
                f"settings, which differ from those it was trained with ({pairs})",
                stacklevel=2,
            )
        else:
            warnings.warn(
                f"resuming from --ckpt_path: the checkpoint's settings replace the config's "
                f"({pairs}). Fix: to train on with new settings, start a new run from the "
                "trained weights instead of resuming.",
                stacklevel=2,
            )


def cli_main(args: list[str] | None = None, run: bool = True) -> LitRLHFCLI:
    """Build (and by default run) the CLI; ``args`` as on the command line."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return LitRLHFCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        # the modules build their own optimizers (manual optimisation): a CLI --optimizer would
        # be ignored and an --lr_scheduler never stepped, so the CLI does not offer them
        auto_configure_optimizers=False,
        args=args,
        run=run,
    )


def main() -> None:
    """Console-script entry point: ``lit-rlhf``. When the run is over the module releases its
    engine (``close``: a vLLM instance), then every rank of a multi-process run meets at a
    barrier and destroys the process group (see ``shutdown_distributed``)."""
    cli = cli_main()
    close = getattr(cli.model, "close", None)
    if callable(close):
        close()
    shutdown_distributed()


if __name__ == "__main__":
    main()
