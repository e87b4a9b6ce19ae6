"""A scalar reward model as the reward of a PPO run (the TRE paper's HH setup scores policies with
a sequence-classification reward model; MGS's chat domain likewise).

The model is loaded on the first call, not at construction, so a config is validated before any
model loads; it lives on its own device and dtype, scores under ``torch.inference_mode`` in
batches, and never holds the policy's graph. Optional centring subtracts the running mean of
every score seen so far (the TRE paper centres its HH rewards).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.models.loading import Dtype, load_reward_model, load_tokenizer
from lit_rlhf.models.scoring import conversation_text, score_texts
from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput


class ScalarRMReward:
    """Scores each completion with a reward model (e.g. one saved by ``RewardModelModule``).

    The query is the row's ``question`` (the raw prompt, before the policy's chat template) when
    the row has one, else the rendered prompt; (query, completion) is rendered for the reward
    model by its own tokenizer (``chat_template``).

    Args:
        model: the reward model: local folder, hub id or ``builtin:<name>``.
        tokenizer: its tokenizer (default: ``model``).
        batch_size: sequences per forward.
        max_length: tokens per sequence (cut from the left).
        chat_template: render with the reward model tokenizer's chat template.
        center: subtract the running mean of all scores so far (this batch included). Every
            call updates it, validation rollouts included; the PPO and judge modules keep it in
            their checkpoints (``state_dict`` / ``load_state_dict``), so a resume continues it.
        device: where the reward model runs (default: CUDA when available, else CPU).
        dtype: its weights.

    Info: ``rm_score`` (the raw, uncentred score).
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        batch_size: int = 16,
        max_length: int = 1024,
        chat_template: bool = True,
        center: bool = False,
        device: str | None = None,
        dtype: Dtype = "float32",
    ) -> None:
        if batch_size < 1 or max_length < 2:
            raise ValueError(
                f"need batch_size >= 1 and max_length >= 2; got {batch_size}, {max_length}"
            )
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.name, self.tokenizer_name = model, tokenizer or model
        self.batch_size, self.max_length = batch_size, max_length
        self.chat_template, self.center, self.dtype = chat_template, center, dtype
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model: Any = None  # loaded by the first call
        self.tokenizer: Any = None
        self.count, self.mean = 0, 0.0  # the running mean, when centring

    def load(self) -> None:
        """Load the tokenizer and model (done by the first call).

        A causal LM gets a new random score head (a smoke-test stand-in): it is drawn from a
        fixed seed, away from the global generators, so that it is the same whenever the
        first call comes (a resumed run skips the sanity check and loads at its first step)
        and loading leaves the run's sampling where it was."""
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = load_reward_model(
                self.name, pad_token_id=self.tokenizer.pad_token_id, dtype=self.dtype
            )
        self.model = model.eval().requires_grad_(False)
        self.model.to(self.device)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        if self.model is None:
            self.load()
        texts = [
            conversation_text(
                self.tokenizer,
                str(row.get("question", prompt)),
                c,
                chat_template=self.chat_template,
            )
            for prompt, c, row in zip(prompts, completions, rows, strict=True)
        ]
        parts = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start : start + self.batch_size]
                parts.append(
                    score_texts(
                        self.model, self.tokenizer, chunk, max_length=self.max_length,
                        device=self.device,
                    ).cpu()
                )  # fmt: skip
        raw = torch.cat(parts) if parts else torch.zeros(0)
        if not torch.isfinite(raw).all():
            raise FloatingPointError(
                f"the reward model {self.name!r} returned a non-finite score; check its weights "
                "and dtype (float16 overflows easily: use bfloat16 or float32)"
            )
        scores = raw.clone()
        if self.center and len(raw):
            self.count += len(raw)
            self.mean += (float(raw.sum()) - len(raw) * self.mean) / self.count
            scores = raw - self.mean
        return RewardOutput(scores=scores, info={"rm_score": raw})

    def state_dict(self) -> dict[str, Any]:
        """The running mean (for checkpoints)."""
        return {"count": self.count, "mean": self.mean}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count, self.mean = int(state["count"]), float(state["mean"])
