"""Data: prompt sources (Countdown, local files, hub datasets) and the prompt data module."""

from lit_rlhf.data.countdown import countdown_question, generate_countdown
from lit_rlhf.data.prompts import PromptDataModule, collate_prompts
from lit_rlhf.data.sources import CountdownPrompts, FilePrompts, PromptSource

__all__ = [
    "CountdownPrompts",
    "FilePrompts",
    "PromptDataModule",
    "PromptSource",
    "collate_prompts",
    "countdown_question",
    "generate_countdown",
]
