"""``lit-rlhf fit|validate|test --config ...``: one LightningCLI for every module and DataModule.

Every cross-component link lives here:
- ``data.tokenizer`` (the DataModule's loaded tokenizer) -> ``model.init_args.tokenizer``, for
  modules whose ``__init__`` takes a ``tokenizer``. For any other LightningModule jsonargparse
  skips the link, as it does every instantiation link whose target is not among the chosen
  class's init args (tests/test_cli.py).
"""

from __future__ import annotations

import os
from typing import Any

from lightning import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_rlhf.strategies.shutdown import shutdown_distributed


class LitRLHFCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer", apply_on="instantiate")


def cli_main(args: list[str] | None = None, run: bool = True) -> LitRLHFCLI:
    """Build (and by default run) the CLI; ``args`` as on the command line."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return LitRLHFCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
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
