"""Generation engines behind one interface (:class:`GenerationEngine`).

``VLLMGenerationEngine`` is importable without vLLM installed: vLLM is imported when the engine
first generates.
"""

from lit_rlhf.rollout.base import GenerationEngine, GenerationEngineLike, engine_refusal
from lit_rlhf.rollout.decode import DecodeLoopEngine, filter_logits, sample_categorical
from lit_rlhf.rollout.hf import HFGenerationEngine, response_mask_from_eos
from lit_rlhf.rollout.vllm import VLLMGenerationEngine

__all__ = [
    "DecodeLoopEngine",
    "GenerationEngine",
    "GenerationEngineLike",
    "HFGenerationEngine",
    "VLLMGenerationEngine",
    "engine_refusal",
    "filter_logits",
    "response_mask_from_eos",
    "sample_categorical",
]
