"""Networks: causal-LM loading (hub id, local folder, ``builtin:``), the response forward pass,
critics, tiny models."""

from lit_rlhf.models.builtin import BUILTIN_NAMES, resolve_builtin
from lit_rlhf.models.critic import CriticModel, ValueHead
from lit_rlhf.models.forward import ResponseForward, forward_response, position_ids_from_mask
from lit_rlhf.models.loading import load_causal_lm, load_reward_model, load_tokenizer, resolve
from lit_rlhf.models.tiny import TinyModelSpec, build_tiny_tokenizer, write_tiny_model

__all__ = [
    "BUILTIN_NAMES",
    "CriticModel",
    "ResponseForward",
    "TinyModelSpec",
    "ValueHead",
    "build_tiny_tokenizer",
    "forward_response",
    "load_causal_lm",
    "load_reward_model",
    "load_tokenizer",
    "position_ids_from_mask",
    "resolve",
    "resolve_builtin",
    "write_tiny_model",
]
