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
The names are imported on first use, and the dispatcher imports only the verb it runs: a command
line costs the imports of its own verb (``docs/cli_startup.md``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LitRLHFCLI", "LitRLHFTrainer", "cli_main", "main"]
_HOME = {"LitRLHFCLI": "app", "LitRLHFTrainer": "app", "cli_main": "app", "main": "dispatch"}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: ``lit-rlhf --help`` starts without the
    LightningCLI's dependencies."""
    if name not in _HOME:
        raise AttributeError(f"module 'lit_rlhf.cli' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lit_rlhf.cli.{_HOME[name]}"), name)
