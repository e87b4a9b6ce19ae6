"""Data: prompt sources (Countdown, local files, hub datasets), plain-text chunks for
compressor-decoder modules, preference-pair sources for generative reward models, judge
templates, the prompt data module, and the supervised fine-tuning data module."""

from lit_rlhf.data.arithmetic import ArithmeticPrompts
from lit_rlhf.data.countdown import countdown_question, generate_countdown
from lit_rlhf.data.judge_templates import (
    JUDGE_TEMPLATES,
    render_judge_prompt,
    render_reflection_prompt,
)
from lit_rlhf.data.mixture import MixturePrompts
from lit_rlhf.data.pairs import PreferencePairs
from lit_rlhf.data.prompts import PromptDataModule, collate_prompts
from lit_rlhf.data.sft import SFTDataModule, collate_sft
from lit_rlhf.data.sources import CountdownPrompts, FilePrompts, PromptSource
from lit_rlhf.data.synthetic_pairs import SyntheticPairs
from lit_rlhf.data.text import TextChunks

__all__ = [
    "JUDGE_TEMPLATES",
    "ArithmeticPrompts",
    "CountdownPrompts",
    "FilePrompts",
    "MixturePrompts",
    "PreferencePairs",
    "PromptDataModule",
    "PromptSource",
    "SFTDataModule",
    "SyntheticPairs",
    "TextChunks",
    "collate_prompts",
    "collate_sft",
    "countdown_question",
    "generate_countdown",
    "render_judge_prompt",
    "render_reflection_prompt",
]
