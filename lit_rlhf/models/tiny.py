"""Offline tiny models: a locally trained byte-level BPE tokenizer and randomly initialised
Llama / Qwen2 networks, for tests and CPU runs on machines without a model hub.

Everything is deterministic given the seed, takes well under a second, and is written as a normal
Hugging Face folder (``config.json``, weights, tokenizer files), so the same loading code serves
tiny and real models.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from lit_rlhf.lazy import MYPY

if MYPY:  # the model classes load with the first model built (a fast CLI start)
    from transformers import PreTrainedModel

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# A role-tagged template; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# Training text for the tokenizer: the vocabulary of the procedural tasks (digits, operators,
# tags) plus plain English, so that prompts tokenize into short sequences.
_CORPUS = [
    "Using the numbers [12, 7, 3], create an equation that equals 33.",
    "You can use basic arithmetic operations (+, -, *, /) and each number must be used once.",
    "Show your work in <think> </think> tags and return the final answer in <answer> </answer>.",
    "<think> 12 * 3 = 36, 36 - 7 = 29 </think> <answer> (12 * 3) - 7 </answer>",
    "What is 15 + 27? The answer is \\boxed{42}. Natalia sold clips to 48 of her friends.",
    "The quick brown fox jumps over the lazy dog. A response should be helpful and honest.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 60 70 80 90 99 100",
    "Question: how many apples are left? Let me think step by step. First, then, so, therefore.",
]


@dataclass(frozen=True)
class TinyModelSpec:
    """Size of a tiny random network."""

    arch: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 1024
    vocab_size: int = 512


def procedural_corpus(lines: int = 3000, *, seed: int = 0) -> list[str]:
    """Deterministic synthetic text with enough distinct merges for a ~2k-token BPE vocabulary:
    Countdown-style task lines, multi-digit sums and sentences of pseudo-words."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfklmnprstvz" for v in "aeiou"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(lines)]
    corpus = []
    for _ in range(lines):
        numbers = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
        target = rng.randint(1, 999)
        corpus.append(f"Using the numbers {numbers}, create an equation that equals {target}.")
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        corpus.append(f"{a} + {b} = {a + b}")
        corpus.append(" ".join(rng.choices(words, k=12)) + ".")
    return corpus


def build_tiny_tokenizer(
    vocab_size: int = 512, extra_corpus: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on a few built-in lines (plus ``extra_corpus``);
    deterministic, well under a second. The built-in lines alone support about 500 tokens; above
    that, :func:`procedural_corpus` is added so that the vocabulary really reaches
    ``vocab_size`` (BPE stops early when it runs out of merges)."""
    if vocab_size > 512:
        extra_corpus = [*extra_corpus, *procedural_corpus()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_CORPUS * 4, *extra_corpus], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def tiny_config_kwargs(spec: TinyModelSpec, vocab_size: int) -> dict[str, Any]:
    """The transformers config arguments of a tiny network of ``spec`` with ``vocab_size``
    rows (also read by the memory plan, :mod:`lit_rlhf.plan.architectures`)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )


def build_tiny_model(spec: TinyModelSpec, vocab_size: int, *, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised causal LM (tied embeddings) with ``vocab_size`` rows, drawn from
    ``seed`` without touching the caller's random state (a builtin model built on first use,
    inside a seeded run, must not change what that run samples)."""
    common = tiny_config_kwargs(spec, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.arch == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM  # (here: a fast CLI start)

            return LlamaForCausalLM(LlamaConfig(**common))
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return Qwen2ForCausalLM(Qwen2Config(**common))


def write_tiny_model(path: str | Path, spec: TinyModelSpec | None = None, *, seed: int = 0) -> Path:
    """Write tokenizer + random model as a Hugging Face folder at ``path`` and return it."""
    spec = spec or TinyModelSpec()
    path = Path(path)
    tokenizer = build_tiny_tokenizer(spec.vocab_size)
    model = build_tiny_model(spec, len(tokenizer), seed=seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
