"""Networks: causal-LM loading (hub id, local folder, ``builtin:``), critics, tiny models."""

from lit_rlhf.models.builtin import BUILTIN_NAMES, resolve_builtin
from lit_rlhf.models.critic import CriticModel, ValueHead
from lit_rlhf.models.loading import load_causal_lm, load_tokenizer, resolve
from lit_rlhf.models.tiny import TinyModelSpec, build_tiny_tokenizer, write_tiny_model

__all__ = [
    "BUILTIN_NAMES",
    "CriticModel",
    "TinyModelSpec",
    "ValueHead",
    "build_tiny_tokenizer",
    "load_causal_lm",
    "load_tokenizer",
    "resolve",
    "resolve_builtin",
    "write_tiny_model",
]
