"""Generation engines behind one interface (:class:`GenerationEngine`)."""

from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.rollout.hf import HFGenerationEngine, response_mask_from_eos

__all__ = ["GenerationEngine", "HFGenerationEngine", "response_mask_from_eos"]
