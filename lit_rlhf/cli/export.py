"""``lit-rlhf export --config ... --ckpt_path ... --out DIR``: a trained module's network as a
folder that ``transformers`` loads (``AutoModelForCausalLM.from_pretrained``; a reward model's
with ``AutoModelForSequenceClassification``), with its tokenizer and chat template.

The command reads the training run's ``--config`` files (and ``--model.*`` / ``--data.*``
overrides) with the same parser as ``fit``, builds the module and the DataModule (whose tokenizer
the CLI links into the module), calls ``configure_model``, loads the exported network's weights
from ``--ckpt_path`` and writes them with :func:`lit_rlhf.training.export.save_network`, the
writer of every module's end-of-fit ``export_dir`` too. ``--trainer.*`` settings are parsed (a
training config reads unchanged) and play no part.

A module names what is exported with ``export_network()``
(:class:`~lit_rlhf.training.export.ExportableModule`): PPO's and the judge's policy, DPO's and
SFT's model, the scalar reward model. Critics, value heads and frozen references are not
exported; a module without the method is refused, naming its class.

``--ckpt_path`` is a Lightning checkpoint file (read with ``weights_only=True``, as ``fit``
reads it) or a DeepSpeed checkpoint folder (ZeRO-2 or ZeRO-3: the partitions are joined into
float32 weights on CPU with DeepSpeed's ``zero_to_fp32``). Frozen parameters (a LoRA base)
that a checkpoint leaves out keep the values ``configure_model`` loaded, the ones the run
trained from. LoRA adapters are merged into the weights (``--lora merged``) or written as a
peft adapter folder (``--lora adapter``). ``--push_to_hub REPO_ID`` uploads the folder with
``huggingface_hub``; with ``--dry_run true`` it prints the files, their sizes and the repo id
and uploads nothing.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lightning import LightningModule

import lit_rlhf.cli.checkpoints as ckpt
from lit_rlhf.cli.app import LitRLHFCLI, cli_main
from lit_rlhf.cli.export_weights import load_network_weights, read_checkpoint
from lit_rlhf.models.lora import is_lora
from lit_rlhf.training.export import (
    ExportableModule,
    ExportDtype,
    LoraExport,
    save_network,
)

_DESCRIPTION = (
    "Write a trained module's network (with its tokenizer and chat template) as a transformers "
    "folder: lit-rlhf export --config RUN.yaml --ckpt_path CKPT --out DIR. The --config files "
    "and --model.* / --data.* overrides are the training run's; --trainer.* settings are parsed "
    "and ignored."
)
_EXPORT_MARKERS = ("config.json", "adapter_config.json")


class ExportError(RuntimeError):
    """``lit-rlhf export`` cannot do what its options ask; the message names the fix."""


@dataclass(frozen=True)
class ExportOptions:
    """The export command's own options (help: :meth:`ExportCLI.add_arguments_to_parser`)."""

    ckpt_path: str
    out: Path
    lora: LoraExport = "merged"
    dtype: ExportDtype | None = None
    overwrite: bool = False
    push_to_hub: str | None = None
    dry_run: bool = False

    @classmethod
    def from_config(cls, config: Any) -> ExportOptions:
        """Read and check the options of a parsed config; every refusal names its fix."""
        ckpt_path, out = config.get("ckpt_path"), config.get("out")
        if not ckpt_path:
            raise ExportError(
                "--ckpt_path is required: the checkpoint to export. Fix: pass a .ckpt file or a "
                "DeepSpeed checkpoint folder of the run the --config files trained."
            )
        if not out:
            raise ExportError(
                "--out is required: the folder to write. Fix: --out DIR (a new or empty folder)."
            )
        options = cls(
            ckpt_path=str(ckpt_path),
            out=Path(out),
            lora=config.get("lora") or "merged",
            dtype=config.get("dtype"),
            overwrite=bool(config.get("overwrite")),
            push_to_hub=config.get("push_to_hub"),
            dry_run=bool(config.get("dry_run")),
        )
        options.check()
        return options

    def check(self) -> None:
        """Refuse a missing checkpoint, an occupied ``--out`` and hub options that cannot work,
        before any model loads."""
        if not Path(self.ckpt_path).exists():
            raise ExportError(
                f"--ckpt_path {self.ckpt_path}: no such file or folder. Fix: pass a .ckpt file "
                "(e.g. <run>/checkpoints/last.ckpt) or a DeepSpeed checkpoint folder."
            )
        check_out_dir(self.out, self.overwrite)
        if self.dry_run and self.push_to_hub is None:
            raise ExportError(
                "--dry_run applies to --push_to_hub only. Fix: add --push_to_hub REPO_ID to see "
                "what would be uploaded, or drop --dry_run."
            )
        if self.push_to_hub is not None:
            check_repo_id(self.push_to_hub, self.dry_run)


def check_out_dir(out: Path, overwrite: bool) -> None:
    """``--out`` must be new or empty; ``--overwrite true`` replaces a previous export only (a
    folder with ``config.json`` or ``adapter_config.json``), never another folder."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: a file, not a folder. Fix: pass a folder path.")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held:
        return
    if not overwrite:
        raise ExportError(
            f"--out {out}: exists and is not empty (it holds {held[:6]}). Fix: pass a new or "
            "empty folder, or --overwrite true to replace the previous export in it."
        )
    if not any((out / name).is_file() for name in _EXPORT_MARKERS):
        raise ExportError(
            f"--out {out}: --overwrite replaces only a previous export (a folder with config.json "
            f"or adapter_config.json), and this folder holds {held[:6]}. Fix: pass another --out."
        )


def check_repo_id(repo_id: str, dry_run: bool) -> None:
    """A valid hub repo id; a real upload needs the hub (not ``HF_HUB_OFFLINE``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ExportError(
            f"--push_to_hub {repo_id!r}: not a hub repo id ({err}). Fix: 'user/name' or 'org/name'."
        ) from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    if offline and not dry_run:
        raise ExportError(
            f"--push_to_hub {repo_id}: HF_HUB_OFFLINE is set, so nothing can be uploaded. Fix: "
            "unset HF_HUB_OFFLINE (and log in: huggingface-cli login), or add --dry_run true to "
            "see what would be uploaded."
        )


class ExportCLI(LitRLHFCLI):
    """The training CLI's parser (``run=False``: no subcommand) with the export options; they
    are checked before any class is built."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        super().add_arguments_to_parser(parser)
        parser.description = _DESCRIPTION
        parser.prog = "lit-rlhf export"
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None,
            help="Required. A Lightning checkpoint file, or a DeepSpeed checkpoint folder "
            "(ZeRO-2/3), of a run of the --config files.",
        )  # fmt: skip
        parser.add_argument(
            "--out", type=str | None, default=None,
            help="Required. The folder to write (new or empty, see --overwrite).",
        )  # fmt: skip
        parser.add_argument(
            "--lora", type=Literal["merged", "adapter"], default="merged",
            help="With LoRA adapters: merged into the weights (a plain transformers folder) or "
            "kept as a peft adapter folder (PeftModel.from_pretrained(base, DIR)). 'adapter' "
            "is refused for a network without adapters.",
        )  # fmt: skip
        parser.add_argument(
            "--dtype", type=Literal["float32", "bfloat16", "float16"] | None, default=None,
            help="Cast the written weights (default: as trained, float32 for trainable ones).",
        )  # fmt: skip
        parser.add_argument(
            "--overwrite", type=bool, default=False,
            help="Replace a previous export in --out (a folder with config.json or "
            "adapter_config.json); any other non-empty folder is refused.",
        )  # fmt: skip
        parser.add_argument(
            "--push_to_hub", type=str | None, default=None,
            help="After writing, upload --out to this hub model repo (created if needed; needs "
            "a login and no HF_HUB_OFFLINE).",
        )  # fmt: skip
        parser.add_argument(
            "--dry_run", type=bool, default=False,
            help="With --push_to_hub: print the files, their sizes and the repo id, upload "
            "nothing.",
        )  # fmt: skip

    def before_instantiate_classes(self) -> None:
        ExportOptions.from_config(self.config)  # refuse bad options before any class is built


def export_main(args: list[str] | None = None) -> Path:
    """``lit-rlhf export ARGS`` (``args`` after ``export``); returns the written folder."""
    with warnings.catch_warnings():
        # from the console script, args is sys.argv[2:] (after "export"), which LightningCLI
        # warns about when sys.argv has arguments too
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = cli_main(args, run=False, cli_class=ExportCLI)
    options = ExportOptions.from_config(cli.config)
    return export_module(cli.model, options)


def export_module(module: LightningModule, options: ExportOptions) -> Path:
    """Build ``module``'s networks, load the checkpoint's weights into the exported one, write
    it to ``options.out`` and, with ``push_to_hub``, upload (or list) the folder."""
    name = type(module).__name__
    if not isinstance(module, ExportableModule):
        raise ExportError(
            f"{name} has no exported network (no export_network method): lit-rlhf export "
            "writes the network of PPOModule, GenerativeRewardModule, DPOModule, SFTModule and "
            f"RewardModelModule. Fix: export a run of one of those, or give {name} an "
            "export_network() returning (network, tokenizer)."
        )
    state, hparams = read_checkpoint(options.ckpt_path)
    class_path = f"{type(module).__module__}.{name}"
    hparams = ckpt.regroup_old(str(options.ckpt_path), hparams, class_path)
    ckpt.check_module(options.ckpt_path, hparams, class_path)
    module.configure_model()
    network, tokenizer = module.export_network()
    if options.lora == "adapter" and not is_lora(network):
        raise ExportError(
            f"--lora adapter: {name}'s network has no LoRA adapters (lora.rank: "
            f"{ckpt.flatten(hparams).get('lora.rank', 0)}). Fix: --lora merged (the default) "
            "writes its weights as they are."
        )
    where = load_network_weights(module, network, state, options.ckpt_path)
    if options.out.exists():  # checked: empty, or a previous export replaced by --overwrite
        shutil.rmtree(options.out)
    base = ckpt.flatten(hparams).get("model")  # the run's own name for it, not a cache path
    save_network(
        network, tokenizer, options.out, lora=options.lora, dtype=options.dtype,
        base_model=base if isinstance(base, str) else None,
    )  # fmt: skip
    kind = "adapter" if options.lora == "adapter" and is_lora(network) else "model"
    print(f"lit-rlhf export: {name}.{where} ({kind}) and its tokenizer -> {options.out}")
    if options.push_to_hub is not None:
        push_folder(options.out, options.push_to_hub, dry_run=options.dry_run)
    return options.out


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.2f} GB"


def push_folder(out: Path, repo_id: str, *, dry_run: bool) -> None:
    """Upload ``out`` to the hub model repo ``repo_id`` (created if needed); ``dry_run``: print
    the files and their sizes and the repo id, and upload nothing."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    verb = "dry run, nothing uploaded: would upload" if dry_run else "uploading"
    print(f"{verb} {len(files)} files ({_size(total)}) from {out} to hub model repo {repo_id}")
    for path in files:
        print(f"  {path.relative_to(out)}  {_size(path.stat().st_size)}")
    if dry_run:
        return
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(out), repo_type="model")
    print(f"uploaded to https://huggingface.co/{repo_id}")
