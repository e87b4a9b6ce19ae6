"""Value networks for PPO with GAE: a separate critic initialised from a causal LM, or a value head
on the policy's last hidden state (shared trunk)."""

from __future__ import annotations

import torch
import transformers  # AutoModel loads on first use: a fast CLI start
from torch import Tensor, nn

from lit_rlhf.models.loading import Dtype, resolve


class _ZeroLinear(nn.Linear):
    """``nn.Linear`` that starts at zero. The zeros are written in ``reset_parameters``, which
    ``nn.Linear.__init__`` calls, because under DeepSpeed ZeRO-3 (``deepspeed.zero.Init``) a
    module's parameters are partitioned as soon as its ``__init__`` returns: an in-place init
    after construction would touch an empty local tensor and leave the random values."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class ValueHead(nn.Module):
    """Linear map from hidden states [..., H] to scalar values [...]; zero-initialised so the first
    value estimates are 0 and early advantages are the raw returns."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = _ZeroLinear(hidden_size, 1)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(hidden.to(self.proj.weight.dtype)).squeeze(-1)


class CriticModel(nn.Module):
    """A transformer trunk (the causal LM without its LM head) plus a :class:`ValueHead`."""

    def __init__(self, trunk: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.value_head = ValueHead(hidden_size)

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: Dtype = "float32") -> CriticModel:
        path = resolve(name_or_path)
        trunk = transformers.AutoModel.from_pretrained(path, dtype=getattr(torch, dtype))
        return cls(trunk.train(), trunk.config.hidden_size)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor
    ) -> Tensor:
        """[B, T] ids -> [B, T] values (value of the state after reading token t). With no
        attention mask, restarts in ``position_ids`` separate packed sequences (no KV cache)."""
        out = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        return self.value_head(out.last_hidden_state)
