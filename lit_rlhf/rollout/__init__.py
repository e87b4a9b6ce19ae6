"""Generation engines behind one interface (:class:`GenerationEngine`).

``VLLMGenerationEngine`` is importable without vLLM installed: vLLM is imported when the engine
first generates; ``VLLMServerEngine`` talks to ``vllm serve`` processes over HTTP.
"""

from lit_rlhf.rollout.base import GenerationEngine, GenerationEngineLike, engine_refusal
from lit_rlhf.rollout.decode import DecodeLoopEngine, filter_logits, sample_categorical
from lit_rlhf.rollout.hf import HFGenerationEngine, response_mask_from_eos
from lit_rlhf.rollout.scorer import TokenScorer
from lit_rlhf.rollout.served_teacher import ServedTeacher
from lit_rlhf.rollout.server import VLLMServerEngine
from lit_rlhf.rollout.vllm import VLLMGenerationEngine
from lit_rlhf.rollout.weight_sync import is_full_update, weight_buckets

__all__ = [
    "DecodeLoopEngine",
    "GenerationEngine",
    "GenerationEngineLike",
    "HFGenerationEngine",
    "ServedTeacher",
    "TokenScorer",
    "VLLMGenerationEngine",
    "VLLMServerEngine",
    "engine_refusal",
    "filter_logits",
    "is_full_update",
    "response_mask_from_eos",
    "sample_categorical",
    "weight_buckets",
]
