"""Load tokenizers and causal LMs by hub id, local folder, or ``builtin:<name>``."""

from __future__ import annotations

import logging
from typing import Any

import torch
import transformers  # its classes load on first use (transformers' lazy module): a fast CLI start

from lit_rlhf.lazy import MYPY
from lit_rlhf.models.builtin import BUILTIN_NAMES, PREFIX, is_builtin, resolve_builtin
from lit_rlhf.settings import Dtype

if MYPY:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def resolve(name_or_path: str) -> str:
    """Map ``builtin:<name>`` to its cached local folder; pass anything else through."""
    return resolve_builtin(name_or_path) if is_builtin(name_or_path) else name_or_path


def _load_error(name: str, err: Exception) -> OSError:
    return OSError(
        f"could not load {name!r}: {err}. It is neither a local model folder nor a reachable hub "
        f"id (HF_HUB_OFFLINE={__import__('os').environ.get('HF_HUB_OFFLINE', '0')}). Fix: pass a "
        f"local folder, download the model beforehand, or use one of "
        + ", ".join(PREFIX + n for n in BUILTIN_NAMES)
    )


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """A tokenizer set up for RL: left padding (generation), and a pad token: a tokenizer without
    one pads with its EOS token (logged as a warning); one with neither is refused."""
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(resolve(name_or_path), **kwargs)
    except OSError as err:
        raise _load_error(name_or_path, err) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"the tokenizer of {name_or_path!r} has neither a pad nor an EOS token: prompts "
                "cannot be padded into batches and responses cannot end. Fix: use a tokenizer "
                "that defines an EOS token (or add pad and EOS tokens and save it to a folder)."
            )
        # EOS doubles as pad: attention masks, not the pad id, say which tokens are padding
        log.warning(
            "the tokenizer of %r has no pad token: padding with its EOS token %r",
            name_or_path,
            tokenizer.eos_token,
        )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name_or_path: str,
    *,
    dtype: Dtype = "float32",
    trust_remote_code: bool = False,
    num_layers: int | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """Load a causal LM in train mode (``from_pretrained`` returns eval mode).

    ``num_layers``: keep only the first ``num_layers`` decoder layers (with the embeddings, the
    final norm and the LM head, so the vocabulary and the lower layers' weights are the
    checkpoint's); None keeps them all. A depth-truncated pretrained model is a smaller network
    that still carries part of the full model's priors (the compressor sizes of the
    size-fidelity comparison, docs/compressor.md)."""
    if num_layers is not None:
        kwargs["config"] = truncated_config(name_or_path, num_layers, trust_remote_code)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            resolve(name_or_path),
            dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
    except OSError as err:
        raise _load_error(name_or_path, err) from err
    return model.train()


def truncated_config(name_or_path: str, num_layers: int, trust_remote_code: bool = False) -> Any:
    """The model's config with ``num_hidden_layers = num_layers`` (and a per-layer
    ``layer_types`` list cut to match); refuses a depth outside 1..the model's own."""
    try:
        config = transformers.AutoConfig.from_pretrained(
            resolve(name_or_path), trust_remote_code=trust_remote_code
        )
    except OSError as err:
        raise _load_error(name_or_path, err) from err
    total = int(config.num_hidden_layers)
    if isinstance(num_layers, bool) or not 1 <= num_layers <= total:
        raise ValueError(
            f"num_layers={num_layers!r} but {name_or_path!r} has {total} layers. Fix: a depth "
            f"from 1 to {total}, or None for the whole model."
        )
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]
    return config


def load_reward_model(
    name_or_path: str, *, pad_token_id: int, dtype: Dtype = "float32"
) -> PreTrainedModel:
    """A sequence-classification model with one output (a scalar reward model), in train mode.

    A causal LM checkpoint gets a new, randomly initialised score head (transformers warns);
    a saved reward model loads whole. ``pad_token_id`` goes into the config: the model reads
    each sequence's score at its last non-pad token."""
    try:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            resolve(name_or_path), num_labels=1, dtype=getattr(torch, dtype)
        )
    except OSError as err:
        raise _load_error(name_or_path, err) from err
    model.config.pad_token_id = pad_token_id
    return model.train()


def context_length(name_or_path: str) -> int | None:
    """The model's context (``max_position_embeddings``) from its config alone, without loading
    weights; None when the config is unreadable here (the model load reports that) or has none."""
    try:
        config = transformers.AutoConfig.from_pretrained(resolve(name_or_path))
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None
