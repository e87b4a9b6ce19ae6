"""On-policy distillation in the core: the frozen teacher that scores the student's sampled
tokens, the check that both read one tokenizer, and the teacher's per-token advantages mixed
into the update's (:func:`~lit_rlhf.algos.distill_advantages`; docs/algorithms.md, "On-policy
distillation").

The teacher is a :class:`~lit_rlhf.rollout.TokenScorer`: here a frozen causal LM
(:class:`FrozenTeacher`, loaded like the KL's reference and, like it, kept out of checkpoints),
or any object with ``token_log_probs`` set on the module's ``teacher`` attribute before the fit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.algos import distill_advantages
from lit_rlhf.errors import SettingError
from lit_rlhf.rollout.base import eval_mode
from lit_rlhf.rollout.scorer import TokenScorer
from lit_rlhf.rollout.served_teacher import ServedTeacher, check_served_temperature
from lit_rlhf.settings import DistillSettings
from lit_rlhf.training.packing import rollout_forward
from lit_rlhf.types import Rollout

# encoded by both tokenizers: equal vocabularies can still split text differently (normalisers)
_PROBE = "Teacher and student: 12 + 7 = 19. <think>ok</think> <answer>(3 * 4)</answer>"


class TeacherTokenizerError(SettingError, ValueError):
    """The teacher reads token ids another way than the student's tokenizer writes them."""

    setting = "model.init_args.distill.teacher"


class FrozenTeacher(nn.Module):
    """A frozen causal LM as a :class:`~lit_rlhf.rollout.TokenScorer`: the same forward as the
    student's log-probs (:func:`~lit_rlhf.training.packing.rollout_forward`), so a teacher with
    the student's weights and dtype gives exactly the student's log-probs.

    Args:
        model: the teacher network, frozen (:func:`~lit_rlhf.training.freeze`).
        budget: packed forwards of at most this many tokens (``update.micro_batch_tokens``);
            None: one padded forward.
    """

    def __init__(self, model: nn.Module, budget: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.budget = budget

    def token_log_probs(self, rollout: Rollout, *, temperature: float) -> Tensor:
        """[B, R] float32 log-probs of the rollout's response tokens under the teacher."""
        return scored_log_probs(self.model, rollout, self.budget, temperature=temperature)


@torch.no_grad()
def scored_log_probs(
    model: nn.Module, rollout: Rollout, budget: int | None, *, temperature: float
) -> Tensor:
    """[B, R] log-probs of the rollout's response tokens under ``model`` in eval mode (no
    dropout) and with its parameters' ``requires_grad`` off for the forward (on CPU the flag
    changes the kernels' last bits, even under ``no_grad``), whatever state the LightningModule
    around it is in: the student's and the teacher's go through here alike, so a teacher equal
    to the student gives exactly the student's log-probs."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        with eval_mode(model):
            return rollout_forward(model, rollout, budget, temperature=temperature)[0]
    finally:
        for p in trainable:
            p.requires_grad_(True)


def served_teacher(distill: DistillSettings, temperature: float) -> ServedTeacher | None:
    """The teacher that ``distill.teacher_urls`` serves (None when unset), built with the
    module, before any model loads: a student temperature other than 1 is refused here."""
    urls = distill.teacher_urls
    if urls is None:
        return None
    check_served_temperature(temperature)
    # the settings refuse teacher_urls without a teacher
    return ServedTeacher(urls, str(distill.teacher), distill.teacher_timeout_s)


def check_teacher_tokenizer(
    student_tokenizer: Any, teacher_tokenizer: Any, *, student: str, teacher: str
) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (vocabulary, end-of-sequence
    token, or the encoding of a probe text), naming both models: the teacher scores the
    student's token ids, which mean other text under another tokenizer."""
    a, b = student_tokenizer, teacher_tokenizer
    difference = None
    vocab_a, vocab_b = a.get_vocab(), b.get_vocab()
    if vocab_a != vocab_b:
        only = sorted(set(vocab_a.items()) ^ set(vocab_b.items()))[:1]
        example = f"; e.g. {only[0][0]!r} -> {only[0][1]} in only one" if only else ""
        difference = f"their vocabularies differ ({len(vocab_a)} vs {len(vocab_b)} tokens{example})"
    elif a.eos_token_id != b.eos_token_id:
        difference = f"their end-of-sequence ids differ ({a.eos_token_id} vs {b.eos_token_id})"
    elif a.encode(_PROBE, add_special_tokens=False) != b.encode(_PROBE, add_special_tokens=False):
        difference = "they split the same text into different tokens"
    if difference is not None:
        raise TeacherTokenizerError(
            f"the teacher {teacher!r} (distill.teacher) and the student {student!r} (model) "
            f"have different tokenizers: {difference}. On-policy distillation scores the "
            "student's sampled token ids under the teacher, so both must read one tokenizer. "
            "Fix: choose a teacher of the student's family (the same tokenizer), e.g. a larger "
            "model of the same series, or a student cut from the teacher"
        )


def mix_distillation(
    advantages: Tensor,
    rollout: Rollout,
    distill: DistillSettings,
    *,
    student: nn.Module,
    teacher: TokenScorer,
    budget: int | None,
    temperature: float,
    mask: Tensor,
) -> Tensor:
    """``distill.task_reward_coef`` x the task ``advantages`` [B, R] plus the teacher's
    per-token advantages on ``mask`` (the counted tokens of the kept samples). The student's
    log-probs of its sampled tokens come from its forward in the trainer
    (:func:`scored_log_probs`, as a local teacher's: a teacher equal to the student gives exactly
    0), not from the engine. ``distill/reverse_kl`` and ``distill/reward_mean`` go into the
    rollout's logged statistics."""
    own = scored_log_probs(student, rollout, budget, temperature=temperature)
    teacher_log_probs = teacher.token_log_probs(rollout, temperature=temperature)
    taught, stats = distill_advantages(
        own,
        teacher_log_probs.to(own.device),
        mask,
        coef=distill.coef,
        discount=distill.discount,
    )
    rollout.term_stats.update(stats)
    task = distill.task_reward_coef
    if task == 0:
        return taught  # the task advantage is left out whole (not multiplied by 0: no NaN)
    return task * advantages + taught.to(advantages.dtype)
