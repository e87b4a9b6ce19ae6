"""Reading ``--ckpt_path`` for the CLI: every way a checkpoint can be wrong ends in one message
that names the path and the cause (the last line the user reads), before any model loads.

A checkpoint is a file ``torch.save`` wrote (a zip archive), a folder DeepSpeed wrote (a
``latest`` file naming a tag folder that holds ``*model_states.pt`` and ``*optim_states.pt``; the
hyperparameters sit in rank 0's model states) or a torch distributed-checkpoint (DCP) folder that
FSDP2 wrote (``.metadata``, the ``*.distcp`` shards and Lightning's ``meta.pt``, which holds the
hyperparameters). All are read with ``weights_only=True``.

Refused: an unreadable file (empty, truncated, text), a folder without a checkpoint's files, a
checkpoint of another module class, settings the configured module does not take, and (for
``validate`` / ``test`` / ``predict``, where the config's settings win) a checkpoint of other
networks than the config's (another ``model``, memory size, ...).
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from lit_rlhf.settings import flat_map, is_flat, regroup_flat

# settings that decide the networks' shapes: a checkpoint must agree on them to be loaded into
# the config's module (the modules check the weights themselves too, without naming the path)
# (dotted keys: a settings group's field is "<group>.<field>"; a compressor setting is matched in
# whichever group the compressor keeps it)
NETWORK_SETTINGS = (
    "model",
    "critic.kind",
    "critic.model",
    "compressor",
    "decoder",
    "compressor_layers",
    "num_memory_tokens",
    "compression_rate",
    "context_tokens",
    "lora.rank",
)


_COMPRESSOR_SHAPE = {"compressor_layers", "num_memory_tokens", "compression_rate", "context_tokens"}


def network_setting(key: str) -> bool:
    """Whether the dotted ``key`` decides a network's shape (:data:`NETWORK_SETTINGS`)."""
    return key in NETWORK_SETTINGS or key.rpartition(".")[2] in _COMPRESSOR_SHAPE


def flatten(settings: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of module settings whose groups are dicts or namespaces."""
    out: dict[str, Any] = {}
    items = settings.items() if hasattr(settings, "items") else vars(settings).items()
    for key, value in items:
        if isinstance(value, dict) or type(value).__name__ == "Namespace":
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def regroup_old(path: str, hparams: dict[str, Any], class_path: str | None) -> dict[str, Any]:
    """An old checkpoint's flat settings (before settings groups: ``lr``, ``clip_low``, ...)
    moved into the module's groups, with a warning naming the moves; others as they are."""
    cls = _module_class(class_path) if class_path else None
    if cls is None or not is_flat(cls, hparams):
        return hparams
    moved = flat_map(cls)
    names = sorted(f"{k} -> {moved[k]}" for k in hparams if k in moved)
    warnings.warn(
        f"--ckpt_path {path}: written before settings groups; its flat settings were moved "
        f"into groups ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}). Fix: none "
        "needed; a checkpoint saved by this version holds the groups.",
        stacklevel=2,
    )
    return regroup_flat(cls, hparams)


def same_setting(a: Any, b: Any) -> bool:
    """Equal settings; model names compared as the folders they resolve to (a run saved with
    ``builtin:tiny-llama`` and one saved with its cache folder hold the same networks)."""
    if a == b:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    from lit_rlhf.models import resolve

    try:
        return str(Path(resolve(a)).resolve()) == str(Path(resolve(b)).resolve())
    except Exception:  # an unknown name: compared as given
        return False


class CheckpointError(RuntimeError):
    """``--ckpt_path`` is not a checkpoint this run can use."""


def unreadable(path: Any, cause: str) -> CheckpointError:
    size = Path(str(path)).stat().st_size
    return CheckpointError(
        f"--ckpt_path {path}: not a readable checkpoint ({size} bytes; empty, truncated, corrupt "
        f"or not a checkpoint: {cause}). Fix: pass an intact checkpoint (e.g. an earlier one or "
        "last.ckpt from the same folder), or start without --ckpt_path."
    )


def read_hparams(path: str) -> dict[str, Any]:
    """The hyperparameters a checkpoint file, DeepSpeed folder or DCP folder holds ({} if
    none)."""
    return dict(read_checkpoint(path).get("hyper_parameters") or {})


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint file's dict, or the non-weight part of a DeepSpeed or DCP folder (its model
    states file / ``meta.pt``: hyperparameters, loop state); a wrong path or file is refused
    naming it."""
    target = Path(path)
    if target.is_dir():
        target = dcp_meta(target) if is_dcp(target) else deepspeed_model_states(target)
    elif not target.is_file():
        raise CheckpointError(f"--ckpt_path {path}: no such file or folder.{_interrupted(target)}")
    if not zipfile.is_zipfile(target):
        # torch.save writes a zip archive; anything else (a text file, half a copy) would reach
        # the weights-only unpickler, which fails with a bare KeyError or ValueError
        raise unreadable(target, "not a zip archive, the format torch.save writes")
    try:
        checkpoint = torch.load(target, weights_only=True, map_location="cpu")
    except (RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError) as err:
        raise unreadable(target, f"{type(err).__name__}: {str(err)[:120] or 'no data'}") from err
    except zipfile.BadZipFile as err:
        raise unreadable(target, f"BadZipFile: {err}") from err
    if not isinstance(checkpoint, dict):
        raise unreadable(target, f"it holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint


def _interrupted(target: Path) -> str:
    """The fix for a checkpoint path that does not exist, naming what a save cut short left."""
    left = {
        f".{target.name}.old": "the previous checkpoint, which a save cut short left there",
        f".{target.name}.partial": "an unfinished save (not loadable)",
    }
    for name, what in left.items():
        if (target.parent / name).exists():
            return (
                f" Beside it is {target.parent / name}: {what}. Fix: rename it to "
                f"{target.name}, or pass another checkpoint."
            )
    return " Fix: check the path."


def is_dcp(folder: Path) -> bool:
    """Whether ``folder`` is a torch distributed checkpoint (Lightning's FSDP2 / ModelParallel
    format): a ``.metadata`` file or Lightning's ``meta.pt`` beside ``*.distcp`` shards."""
    return (folder / ".metadata").is_file() or (folder / "meta.pt").is_file()


def dcp_meta(folder: Path) -> Path:
    """The ``meta.pt`` of a DCP checkpoint folder (everything but the weights and optimizer
    state); a folder that lacks part of a DCP checkpoint is refused, naming what it lacks."""
    lacks = [n for n in (".metadata", "meta.pt") if not (folder / n).is_file()]
    if not any(folder.glob("*.distcp")):
        lacks.append("*.distcp shards")
    if lacks:
        raise CheckpointError(
            f"--ckpt_path {folder}: a distributed (FSDP2) checkpoint folder without "
            f"{', '.join(lacks)}: not a whole checkpoint. Fix: pass a folder an FSDP2 run "
            "finished writing (a save cut short leaves the previous one in place)."
        )
    return folder / "meta.pt"


def deepspeed_model_states(folder: Path) -> Path:
    """Rank 0's model-states file of a DeepSpeed checkpoint folder; a folder without the files
    a DeepSpeed checkpoint has is refused, naming what it lacks."""
    found = sorted(p.name for p in folder.iterdir())[:8]
    fix = (
        "Fix: pass the folder DeepSpeed wrote (it holds 'latest' and the tag folder it names), "
        "an FSDP2 checkpoint folder (.metadata, meta.pt, *.distcp) or a .ckpt file."
    )
    latest = folder / "latest"
    tags = [latest.read_text().strip()] if latest.is_file() else []
    tags += [p.name for p in folder.iterdir() if p.is_dir() and any(p.glob("*model_states.pt"))]
    if not tags:
        raise CheckpointError(
            f"--ckpt_path {folder}: a folder without a checkpoint's files (no 'latest' file and no "
            f"tag folder with *model_states.pt; it holds {found}). {fix}"
        )
    tag = folder / tags[0]
    states = sorted(tag.glob("*model_states.pt")) if tag.is_dir() else []
    optim = sorted(tag.glob("*optim_states.pt")) if tag.is_dir() else []
    if not states or not optim:
        lacks = (
            "its folder"
            if not tag.is_dir()
            else "*model_states.pt"
            if not states
            else ("*optim_states.pt")
        )
        raise CheckpointError(
            f"--ckpt_path {folder}: a DeepSpeed checkpoint folder without its files ('latest' "
            f"names {tags[0]!r}, which lacks {lacks}). {fix}"
        )
    rank0 = [p for p in states if "rank_0_" in p.name or p.name == "mp_rank_00_model_states.pt"]
    return (rank0 or states)[0]


def check_module(path: str, hparams: dict[str, Any], class_path: str | None) -> None:
    """Refuse a checkpoint of another module class, or with settings the config's module does
    not take (a checkpoint saved outside the CLI records no class)."""
    if class_path is None:
        return
    saved = hparams.get("_class_path")
    name = class_path.rsplit(".", 1)[-1]
    if saved is not None and saved.rsplit(".", 1)[-1] != name:
        raise CheckpointError(
            f"--ckpt_path {path}: a checkpoint of {saved}, but the config's model is {class_path}. "
            f"Fix: pass a checkpoint of a {name} run, or run with the config of the "
            f"{saved.rsplit('.', 1)[-1]} run that wrote it."
        )
    if saved is not None:
        return
    accepted = _init_parameters(class_path)
    if accepted is None:
        return
    unknown = sorted(k for k in hparams if not k.startswith("_") and k not in accepted)
    if unknown:
        raise CheckpointError(
            f"--ckpt_path {path}: a checkpoint of another module: its settings {unknown[:6]} are "
            f"not {name}'s. Fix: pass a checkpoint of a {name} run, or run with the config of "
            "the module that wrote it."
        )


def _module_class(class_path: str) -> type | None:
    module_name, _, attr = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        return None


def _init_parameters(class_path: str) -> set[str] | None:
    cls = _module_class(class_path)
    try:
        params = inspect.signature(cls).parameters.values() if cls is not None else None
    except (TypeError, ValueError):
        return None
    if params is None:
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def check_networks(path: str, saved: dict[str, Any], config: dict[str, Any]) -> None:
    """For an evaluation (the config's settings win): refuse a checkpoint whose networks are
    not the config's, naming each differing setting."""
    saved, config = flatten(saved), flatten(config)
    differ = [
        f"{key}: checkpoint {saved[key]!r}, config {config.get(key)!r}"
        for key in sorted(saved)
        if network_setting(key) and key in config and not same_setting(saved[key], config[key])
    ]
    if differ:
        raise CheckpointError(
            f"--ckpt_path {path}: a checkpoint of other networks than the config's "
            f"({'; '.join(differ)}): its weights do not fit. Fix: evaluate with the settings it "
            "was trained with (the config of that run), or pass a checkpoint of this config."
        )
