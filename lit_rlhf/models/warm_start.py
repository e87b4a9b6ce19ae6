"""``builtin:tiny-llama-agent``: the random tiny Llama warm-started on the shipped scripted
demonstrations, so that a multi-turn run on a CPU shows several turns per episode in seconds.

A random network almost never samples its end-of-sequence token, so every turn runs into the
token budget and the episode is cut after its first turn (``env/cut`` 1.0): an environment's
second ``step`` is never reached. Here the network is trained for 150 steps (seconds
on one core) on ``lit_rlhf/data/samples/tiny_agent_demos.jsonl`` (scripted Countdown-calculator
and guess-the-number episodes, written by :mod:`lit_rlhf.envs.tiny_demos` with the real
environments' answers), laid out as the multi-turn loop lays out an episode: the prompt with
the generation prompt, each agent turn followed by the end-of-sequence token, and the chat
template's text between turns. The loss is on the agent's tokens only. It learns the turn
format (short turns that end), not the tasks.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DEMOS = Path(__file__).resolve().parents[1] / "data" / "samples" / "tiny_agent_demos.jsonl"


def demos_digest(path: Path = DEMOS) -> str:
    """The first 8 hex digits of the demonstrations' SHA-256 (part of the cache key)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8]


def episode_tokens(
    tokenizer: Any, messages: Sequence[Mapping[str, str]]
) -> tuple[list[int], list[bool]]:
    """A chat row's token ids as the multi-turn loop builds its episode, and which of them the
    agent wrote (each assistant turn's content and the end-of-sequence token after it). The
    template must render a conversation as an extension of its shorter prefixes."""
    eos_text, eos = tokenizer.eos_token or "", tokenizer.eos_token_id
    ids: list[int] = []
    agent: list[bool] = []
    rendered = ""  # the text the episode holds so far (its EOS tokens not included)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(
            list(messages[:index]), tokenize=False, add_generation_prompt=True
        )
        if not prefix.startswith(rendered):
            raise ValueError("the chat template does not extend its prefixes; no warm start")
        between = prefix[len(rendered) :]
        if ids and eos_text and between.startswith(eos_text):
            between = between[len(eos_text) :]  # the agent's own EOS token already holds it
        turn = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
        env = tokenizer(between, add_special_tokens=False)["input_ids"]
        ids += [*env, *turn, eos]
        agent += [False] * len(env) + [True] * (len(turn) + 1)
        rendered = prefix + message["content"]
    return ids, agent


def warm_start(
    folder: Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    steps: int = 150,
    batch_size: int = 8,
    lr: float = 5e-3,
    seed: int = 0,
) -> None:
    """Train the model in ``folder`` on the agent turns of ``rows`` (``{"messages": [...]}``)
    with AdamW on one CPU thread (deterministic given ``seed``; a 0.1M-parameter network runs
    several times slower on two threads of a busy machine) and save it there."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    examples = [episode_tokens(tokenizer, row["messages"]) for row in rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train(folder, examples, steps, batch_size, lr, seed, tokenizer.pad_token_id)
    finally:
        torch.set_num_threads(threads)


def _train(
    folder: Path, examples: list[tuple[list[int], list[bool]]], steps: int, batch_size: int,
    lr: float, seed: int, pad: int,
) -> None:  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch])
        counted = torch.tensor([a + [False] * (width - len(a)) for _, a in batch])
        mask = torch.tensor([[True] * len(i) + [False] * (width - len(i)) for i, _ in batch])
        labels = ids.masked_fill(~counted, -100)
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(folder)


def read_demos(path: Path = DEMOS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
