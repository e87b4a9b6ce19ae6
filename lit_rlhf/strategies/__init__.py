"""Strategy support: DeepSpeed checkpoint folders without frozen models, DeepSpeed ZeRO-2/3 on CPU
processes, FSDP2 over every rank (Lightning's ModelParallelStrategy), and what a module with manual
optimisation needs under DeepSpeed (ZeRO-3 model building, gradient clipping, micro-batch
accumulation, gradient norm)."""

from lit_rlhf.strategies.deepspeed import DeepSpeedStrategy
from lit_rlhf.strategies.deepspeed_cpu import CPUDeepSpeedStrategy
from lit_rlhf.strategies.deepspeed_hooks import (
    deepspeed_grad_norm,
    is_deepspeed,
    set_deepspeed_gradient_clipping,
    start_micro_batch,
    transformers_zero3_context,
)
from lit_rlhf.strategies.fsdp2 import FSDP2Strategy, is_fsdp2
from lit_rlhf.strategies.shutdown import shutdown_distributed

__all__ = [
    "CPUDeepSpeedStrategy",
    "DeepSpeedStrategy",
    "FSDP2Strategy",
    "deepspeed_grad_norm",
    "is_deepspeed",
    "is_fsdp2",
    "set_deepspeed_gradient_clipping",
    "shutdown_distributed",
    "start_micro_batch",
    "transformers_zero3_context",
]
