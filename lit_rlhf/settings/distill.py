"""``distill``: on-policy distillation in ``PPOModule``: a frozen teacher scores every token the
student sampled, and the negative reverse KL to it is the student's per-token reward."""

from __future__ import annotations

from dataclasses import dataclass, fields

from lit_rlhf.settings.base import Rule, SettingsGroup, non_negative


@dataclass(frozen=True)
class DistillSettings(SettingsGroup):
    """On-policy distillation (``model.init_args.distill``; docs/algorithms.md, "On-policy
    distillation"). Each sampled response token t gets the reward ``r_t = -coef * (log
    pi_student(x_t) - log pi_teacher(x_t))`` (the negative k1 estimate of the reverse KL, GKD
    arXiv 2306.13649; Thinking Machines' "On-Policy Distillation", 2025), and its advantage is
    the discounted sum of these rewards from t on, added to ``task_reward_coef`` times the
    advantage ``advantage.estimator`` makes of the task reward.

    Args:
        teacher: the frozen teacher: hub id, local folder or ``builtin:<name>`` (null: no
            distillation). Its tokenizer must be the student's (refused otherwise, naming both).
            It is loaded in ``precision.reference_dtype`` (null: ``precision.dtype``) unless a
            teacher object that scores tokens (``lit_rlhf.rollout.TokenScorer``, e.g. a served
            one) was set on the module's ``teacher`` attribute before the fit, or
            ``teacher_urls`` is set.
        teacher_urls: ``vllm serve`` processes serving the teacher (``http://host:port``; null:
            the teacher is loaded in the trainer's processes). Each is asked for the prompt
            log-probs of the student's samples (:class:`lit_rlhf.rollout.ServedTeacher`); it must
            serve ``teacher`` by that id, and the student must sample at temperature 1 (vLLM's
            prompt log-probs are untempered). Only the teacher's tokenizer loads here.
        teacher_timeout_s: the deadline of one scoring request to a served teacher.
        coef: the weight of the per-token reverse-KL reward (> 0).
        task_reward_coef: the weight of the task reward's advantage (0: pure distillation, the
            reward is only logged; 1: the two are added, as the Thinking Machines recipe adds the
            KL advantage to an environment's).
        discount: the per-token rewards' discount: 0 makes each token's own reward its
            advantage (the Thinking Machines recipe), 1 the sum of its and every later token's
            (the return-to-go of the sequence-level reverse KL).
    """

    GROUP = "distill"

    teacher: str | None = None
    coef: float = 1.0
    task_reward_coef: float = 0.0
    discount: float = 0.0
    teacher_urls: list[str] | None = None
    teacher_timeout_s: float = 600.0

    def rules(self) -> list[Rule]:
        return [
            ("coef", 0 < self.coef < float("inf"),
             "> 0 and finite (the weight of the per-token reverse-KL reward; a negative one "
             "would push the student away from the teacher)"),
            ("task_reward_coef", non_negative(self.task_reward_coef),
             ">= 0 and finite (0: the task reward is only logged)"),
            ("discount", 0 <= self.discount <= 1,
             "in [0, 1] (0: each token's own reward is its advantage)"),
            ("teacher_urls", self.teacher_urls is None or (
                not isinstance(self.teacher_urls, str) and len(self.teacher_urls) > 0
                and all(str(u).startswith(("http://", "https://")) for u in self.teacher_urls)),
             "null or a non-empty list of http(s)://HOST:PORT URLs, one per `vllm serve` "
             "process serving the teacher"),
            ("teacher_timeout_s", 0 < self.teacher_timeout_s < float("inf"),
             "> 0 seconds (the deadline of one scoring request)"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.teacher is not None:
            return
        defaults = {f.name: f.default for f in fields(self)}
        changed = [
            name
            for name in (
                "coef",
                "task_reward_coef",
                "discount",
                "teacher_urls",
                "teacher_timeout_s",
            )
            if getattr(self, name) != defaults[name]
        ]
        if changed:
            raise ValueError(
                f"distill.{changed[0]}={getattr(self, changed[0])!r} is set but distill.teacher "
                "is null: without a teacher there is no distillation, so it would do nothing. "
                f"Fix: set {self.key('teacher')} (a hub id, folder or builtin:<name> with the "
                f"student's tokenizer), or remove distill.{changed[0]}."
            )

    @property
    def enabled(self) -> bool:
        """Whether the module distils (a teacher is set)."""
        return self.teacher is not None

    @property
    def pure(self) -> bool:
        """Whether the advantage is the teacher's alone (``task_reward_coef`` 0): the task
        reward's estimator then needs no group of samples per prompt."""
        return self.enabled and self.task_reward_coef == 0
