"""The ``lit-rlhf`` command line: one module per verb, one for the errors it prints.

- :mod:`~lit_rlhf.cli.dispatch`: ``main``, the console script (``lit-rlhf``, ``python -m
  lit_rlhf.cli``): ``export`` to its module, the other verbs to the LightningCLI.
- :mod:`~lit_rlhf.cli.app`: ``LitRLHFCLI`` (``fit`` / ``validate`` / ``test`` / ``predict``,
  every ``link_arguments``), ``LitRLHFTrainer`` (``precision: auto``) and ``cli_main``.
- :mod:`~lit_rlhf.cli.export`: ``lit-rlhf export``, a trained module's network as a
  transformers folder; :mod:`~lit_rlhf.cli.export_weights` reads the weights it writes.
- :mod:`~lit_rlhf.cli.checkpoints`: every wrong ``--ckpt_path`` refused with its path and cause.
- :mod:`~lit_rlhf.cli.errors`: a refused configuration printed with its cause last.

Imports go one way: dispatch > export > app, export_weights > checkpoints, errors (a contract in
pyproject.toml); only this file imports the package's public names back up, and nothing in the
package imports ``lit_rlhf.cli`` itself. Nothing else in ``lit_rlhf`` imports the CLI.
"""

from lit_rlhf.cli.app import LitRLHFCLI, LitRLHFTrainer, cli_main
from lit_rlhf.cli.dispatch import main

__all__ = ["LitRLHFCLI", "LitRLHFTrainer", "cli_main", "main"]
