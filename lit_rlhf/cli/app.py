"""``lit-rlhf fit|validate|test|predict --config ...``: one LightningCLI for every module and
DataModule (``lit-rlhf export`` builds on it: :mod:`lit_rlhf.cli.export`).

Every cross-component link lives here:
- ``data.tokenizer`` (the DataModule's loaded tokenizer) -> ``model.init_args.tokenizer``, for
  modules whose ``__init__`` takes a ``tokenizer``. For any other LightningModule jsonargparse
  skips the link, as it does every instantiation link whose target is not among the chosen
  class's init args (tests/test_cli.py).

The optimizer and its learning-rate schedule come from each module's settings (``lr``,
``weight_decay``, ..., and ``lr_warmup_steps`` / ``lr_warmup_ratio``, ``lr_schedule``,
``min_lr_ratio``, ``lr_interval``, ``lr_total_steps``: :mod:`lit_rlhf.training.lr_schedule`).
LightningCLI's ``--optimizer`` / ``--lr_scheduler`` are not offered: an ``--lr_scheduler`` takes
effect only together with an ``--optimizer``, which would replace the module's own optimizer and
its param groups (PPO's policy and critic lrs, trainable parameters only); Lightning never steps a
scheduler under manual optimisation, and a scheduler handed to DeepSpeed is stepped on every
``engine.step()``, not once per rollout batch as the authors' verl recipes step it.

``trainer.precision`` also takes ``auto`` (:class:`LitRLHFTrainer`, LightningCLI's
``trainer_class``): ``bf16-mixed`` on a CUDA GPU with bf16 and on a CPU with native bf16
(``avx512_bf16`` / ``amx_bf16``), else ``32-true``, logged with the reason; an explicit precision
is used as given. Whatever the precision, each module's ``setup`` refuses trainable weights that
would be stepped in 16 bits without float32 master weights
(:func:`~lit_rlhf.training.check_trainable_precision`).

With ``--ckpt_path``, LightningCLI replaces the config's model settings by the checkpoint's saved
hyperparameters. lit-rlhf keeps that for ``fit`` (a resume continues the run it resumes) and
warns about every setting of the config it overrides; for ``validate``, ``test`` and ``predict``
the config's settings win (the checkpoint gives the weights: evaluate a trained judge with
another ``inference``), with a warning naming the settings that differ from the checkpoint's.
Every trainer gets :class:`~lit_rlhf.training.CheckpointOnInterrupt` unless the config has one:
SIGTERM or Ctrl-C during ``fit`` saves ``interrupted.ckpt`` (next to ModelCheckpoint's, else in
``<default_root_dir>/checkpoints``) after the current batch and exits with 143 / 130.
A resume whose checkpoint was trained from another model than the data's tokenizer is refused,
and so is a ``--ckpt_path`` that is not a readable checkpoint (both name the file). The Trainer
loads ``--ckpt_path`` with ``weights_only=True`` (tensors and plain types, no pickled code)
unless the command line says ``--weights_only false``.
A run of more than one process starts with a preflight: every rank meets at the rendezvous
within ``LIT_RLHF_PREFLIGHT_TIMEOUT_S`` (default 60 s), or the run ends with one line naming the
missing ranks (:mod:`lit_rlhf.strategies.preflight`).
A resumed ``fit`` logs into the CSV / TensorBoard folder of the run it resumes, keeping the rows
logged before the checkpoint (:mod:`lit_rlhf.cli.log_folder`).
Checkpoint files are written atomically (:class:`~lit_rlhf.training.AtomicCheckpointIO`: a run
killed mid-write leaves ``last.ckpt`` whole) unless the config chooses a checkpoint IO plugin.

A refused configuration ends with the cause (:mod:`lit_rlhf.cli.errors`): a parse error prints
the keys that lead to it and ``error: <key>: <cause>. Fix: ...`` last; an error raised by a
class while the CLI builds it propagates as that class's own exception, not inside
jsonargparse's union report with its namespace dump; a class's own refusal of a setting (a
``ValueError`` / ``TypeError`` saying ``Fix: ...``, e.g. a settings group's range) ends
``lit-rlhf`` with that one line (``LIT_RLHF_DEBUG=1``: the traceback).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any, Literal

from lightning import LightningDataModule, LightningModule, Trainer
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch.cli import LightningCLI

import lit_rlhf.cli.checkpoints as ckpt
from lit_rlhf.cli.errors import LitRLHFParser, refuse_abbreviations, root_cause
from lit_rlhf.cli.log_folder import continue_log_folders, logged_batches, unlogged_row
from lit_rlhf.cli.quiet import quiet_third_party
from lit_rlhf.errors import config_refusal

_EVALUATE = ("validate", "test", "predict")
_EXPORT_EPILOG = (
    "lit-rlhf export --config RUN.yaml --ckpt_path CKPT --out DIR: a trained module's network "
    "as a transformers folder (lit-rlhf export --help). lit-rlhf plan --config RUN.yaml: what "
    "each GPU of the run will hold, the batch figures and a verdict, before anything loads "
    "(lit-rlhf plan --help)."
)


class LitRLHFTrainer(Trainer):
    """Lightning's Trainer, with ``precision: auto``.

    Every argument but ``precision`` is Lightning's, passed on as given.

    Args:
        precision: Lightning's precision, or ``auto``: ``bf16-mixed`` on a CUDA GPU with bf16
            and on a CPU with native bf16 (avx512_bf16 / amx_bf16), else ``32-true``; resolved
            before Lightning sees it and logged with the reason
            (:func:`~lit_rlhf.training.precision.resolve_precision`). An explicit value is
            never changed.
        enable_checkpointing: Lightning's; ``false`` also leaves out the config's
            :class:`~lit_rlhf.callbacks.PeriodicCheckpoint` (every shipped config has one),
            which Lightning would otherwise refuse beside it.
    """

    def __init__(
        self, *, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs: Any
    ) -> None:
        from lit_rlhf.training.precision import resolve_precision  # (lazy: a fast --help)
        from lit_rlhf.training.run_checkpoint import without_periodic

        resolved = resolve_precision(precision, kwargs.get("accelerator", "auto"))
        if kwargs.get("enable_checkpointing") is False:  # the command line's choice wins
            kwargs["callbacks"] = without_periodic(kwargs.get("callbacks"))
        super().__init__(precision=resolved, **kwargs)


class LitRLHFCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        argv = kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        named = str(argv[0]) if isinstance(argv, list | tuple) and argv else None
        self._verb = named if named in LightningCLI.subcommands() else None
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Only the subcommand the command line names (``fit``): building each subcommand's
        parser reads every class signature again (about 0.1 s each, a quarter of a refused
        config's start-up); with none named (``lit-rlhf --help``, a typo), all of them."""
        every = LightningCLI.subcommands()
        return {self._verb: every[self._verb]} if self._verb else every

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer", apply_on="instantiate")

    def parse_arguments(self, parser: Any, args: Any) -> None:
        argv = sys.argv[1:] if args is None else args
        if not isinstance(argv, list | tuple):  # a dict or namespace from Python
            return super().parse_arguments(parser, args)
        argv = [str(a) for a in argv]
        given = group_nulls_as_dicts(argv)
        if args is None:  # the command line itself (LightningCLI warns about args and argv)
            self.config = parser.parse_args(given)
        else:
            super().parse_arguments(parser, given)
        refuse_abbreviations(parser, argv, self.config)

    def after_instantiate_classes(self) -> None:
        from lit_rlhf.strategies.preflight import install_preflight
        from lit_rlhf.training.checkpoint_io import use_atomic_checkpoint_io

        use_atomic_checkpoint_io(self.trainer.strategy)
        install_preflight(self.trainer.strategy)  # all ranks meet within a deadline first

    def before_fit(self) -> None:
        """A resumed run logs into the folder of the run it resumes
        (:mod:`lit_rlhf.cli.log_folder`)."""
        path = self.config[self.subcommand].get("ckpt_path")
        if path is not None:
            logged, row = getattr(self, "_logged_batches", None), getattr(self, "_unlogged", None)
            continue_log_folders(self.trainer, str(path), logged, row)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        from lit_rlhf.training.faults import CheckpointOnInterrupt

        trainer = super().instantiate_trainer(**kwargs)
        callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]  # set in __init__
        if not any(isinstance(c, CheckpointOnInterrupt) for c in callbacks):
            callbacks.append(CheckpointOnInterrupt())  # SIGTERM / Ctrl-C: a resumable checkpoint
        return trainer

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            cause = root_cause(err)
            refusal = config_refusal(cause)  # "... Fix: ...": one line (lit-rlhf's entry point)
            if refusal is not None:
                raise refusal from cause
            if cause is err:
                raise
            raise cause from None  # the class's own message last, not a namespace dump

    def _read_ckpt_hparams(self) -> None:
        """LightningCLI's hyperparameter reading (for files and DeepSpeed folders), each wrong
        checkpoint refused with its path and cause (:mod:`lit_rlhf.cli.checkpoints`)."""
        subcommand = self.config["subcommand"]
        path = self.config[subcommand].get("ckpt_path")
        if path is None:
            return
        checkpoint = ckpt.read_checkpoint(str(path))
        self._logged_batches = logged_batches(checkpoint)
        self._unlogged = unlogged_row(checkpoint)
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        del checkpoint
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        class_path = self.config[subcommand].get("model.class_path")
        hparams = ckpt.regroup_old(str(path), hparams, hparams.get("_class_path") or class_path)
        ckpt.check_module(str(path), hparams, class_path)
        # a checkpoint saved outside the CLI records no class: its settings are the config's
        # module's (check_module made sure they fit)
        class_path = hparams.pop("_class_path", class_path)
        if class_path is not None:
            hparams = {"class_path": class_path, "dict_kwargs": hparams}
        self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return super()._parse_ckpt_path()
        if self.config[subcommand].get("weights_only", False) is None:
            # the Trainer's own load of --ckpt_path: tensors and plain types only, never pickled
            # code (LightningCLI's read of the hyperparameters above is weights_only already)
            self.config[subcommand]["weights_only"] = True
        init = self.config[subcommand].get("model.init_args")
        if init is None:
            return self._read_ckpt_hparams()
        before = init.clone()
        self._read_ckpt_hparams()
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
            saved = {key: after.get(key) for key in changed}
            ckpt.check_networks(str(self.config[subcommand]["ckpt_path"]), saved, dict(before))
            for key in changed:
                after[key] = before.get(key)
            warnings.warn(
                f"{subcommand} with --ckpt_path: the checkpoint's weights with the config's "
                f"settings, which differ from those it was trained with ({pairs})",
                stacklevel=2,
            )
        else:
            _check_resumed_tokenizer(self.config[subcommand], before.get("model"))
            warnings.warn(
                f"resuming from --ckpt_path: the checkpoint's settings replace the config's "
                f"({pairs}). Fix: to train on with new settings, start a new run from the "
                "trained weights instead of resuming.",
                stacklevel=2,
            )


_GROUP_FIELD = re.compile(r"^--(model\.init_args\.\w+)\.(\w+)$")
_NULLS = ("null", "None", "~")


def group_nulls_as_dicts(argv: list[str]) -> list[str]:
    """``--model.init_args.<group>.<field>=null`` as ``--model.init_args.<group>={<field>:
    null}``: jsonargparse parses a settings-group field given on the command line against the
    field's first type only (``float | None`` refuses ``null``), while the dict form merges into
    the group like any other value. Both ``--key=value`` and ``--key value`` are rewritten."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        key, eq, value = token.partition("=")
        if not eq and i + 1 < len(argv) and _GROUP_FIELD.match(key):
            value, i = argv[i + 1], i + 1
        match = _GROUP_FIELD.match(key)
        if match and value in _NULLS:
            out.append(f"--{match.group(1)}={{{match.group(2)}: null}}")
        else:
            out.append(token if eq or not match else f"{token}={value}")
        i += 1
    return out


def _check_resumed_tokenizer(config: Any, config_model: Any) -> None:
    """A resume takes the checkpoint's ``model``; the data's tokenizer stays the config's. When
    that tokenizer was the config's own model, it is not the checkpoint's model's."""
    model, tokenizer = config.get("model.init_args.model"), config.get("data.init_args.tokenizer")
    if model is None or tokenizer is None or ckpt.same_setting(model, config_model):
        return
    if tokenizer == config_model:
        raise ckpt.CheckpointError(
            f"--ckpt_path {config.get('ckpt_path')}: a run of model {model!r}, and the config "
            f"trains {config_model!r} "
            f"with its tokenizer (data.init_args.tokenizer={tokenizer!r}): the resumed policy "
            f"would read another model's token ids. Fix: set model.init_args.model and "
            f"data.init_args.tokenizer to {model!r} to resume that run, or start a new run "
            "(no --ckpt_path) for the config's model."
        )


def importable_working_folder() -> None:
    """Append the working folder to the import path, last, so that a class path of the user's
    own module (``my_rewards.correctness`` beside the config) imports as it does in their
    Python, while an installed package is still found first: a ``datasets.py`` in the folder
    does not shadow the library. The ``lit-rlhf`` console script does not put the working
    folder on the path itself (``python -m`` does, first); every rank of a multi-process run
    calls this (Lightning's launcher re-runs the command line, torchrun starts each rank)."""
    folder = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == folder for p in sys.path):
        sys.path.append(folder)


def cli_main(
    args: list[str] | None = None, run: bool = True, cli_class: type[LitRLHFCLI] = LitRLHFCLI
) -> LitRLHFCLI:
    """Build (and by default run) the CLI; ``args`` as on the command line. ``cli_class``: a
    subclass with more arguments (``lit-rlhf export``: :mod:`lit_rlhf.cli.export`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quiet_third_party()
    importable_working_folder()
    return cli_class(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        parser_class=LitRLHFParser,  # a refused config prints its cause last
        # the modules build their own optimizers and lr schedules (manual optimisation): a CLI
        # --optimizer would replace their param groups and an --lr_scheduler never be stepped,
        # so the CLI does not offer them (the module docstring says why)
        auto_configure_optimizers=False,
        trainer_class=LitRLHFTrainer,  # trainer.precision: auto
        # the root parser's help names the subcommand that LightningCLI does not know
        parser_kwargs={"epilog": _EXPORT_EPILOG},
        args=args,
        run=run,
    )
