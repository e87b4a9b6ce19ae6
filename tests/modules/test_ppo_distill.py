"""On-policy distillation in PPOModule (issue 39 item 8; docs/algorithms.md, "On-policy
distillation"): a teacher equal to the student gives exactly zero reward and zero gradient; a
teacher that prefers planted tokens pulls the student's per-token reverse KL down; a teacher with
another tokenizer is refused naming both; the settings refuse values that do nothing; the
shipped config runs through the CLI as a user runs it."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from lit_rlhf.algos import distill_advantages
from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine, ServedTeacher, TokenScorer
from lit_rlhf.rollout.served_teacher import ServedTeacherError
from lit_rlhf.settings import DistillSettings
from lit_rlhf.training.teacher import TeacherTokenizerError
from lit_rlhf.types import Rollout
from tests.helpers import quiet_trainer

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo" / "countdown_distill_tiny.yaml"


class RecordMetrics(L.Callback):
    """The logged step metrics after every training batch."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    def series(self, key: str) -> list[float]:
        return [row[key] for row in self.rows if key in row]


class PlantedTeacher:
    """A teacher served elsewhere, as the :class:`TokenScorer` protocol sees it: it puts 0.9 of
    its mass on ``planted`` token ids whatever the context, the rest spread evenly."""

    def __init__(self, vocab_size: int, planted: list[int]) -> None:
        rest = math.log(0.1 / (vocab_size - len(planted)))
        self.log_p = torch.full((vocab_size,), rest)
        self.log_p[planted] = math.log(0.9 / len(planted))

    def token_log_probs(self, rollout: Rollout, *, temperature: float) -> torch.Tensor:
        return self.log_p[rollout.response_ids]


def _fit(model_dir: str, tmp_path: Path, steps: int, teacher: Any = None, **kwargs: Any):
    L.seed_everything(0)
    data = PromptDataModule(
        tokenizer=model_dir,
        train=CountdownPrompts(num_examples=128, seed=0, num_numbers=3, max_value=20),
        batch_size=4,
    )
    module = PPOModule(
        reward=DigitFractionReward(),  # scores differ: a task advantage would not be 0
        model=model_dir,
        tokenizer=data.tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8),
        rollout={"samples_per_prompt": 4},
        **kwargs,
    )
    module.teacher = teacher  # None: loaded from distill.teacher
    record = RecordMetrics()
    quiet_trainer(tmp_path, max_steps=steps, callbacks=[record]).fit(module, datamodule=data)
    return module, record


def test_a_teacher_equal_to_the_student_gives_zero_reward_and_zero_gradient(
    tiny_model_dir, tmp_path
):
    distill = {"teacher": tiny_model_dir}  # the student's own weights, task_reward_coef 0
    module, record = _fit(tiny_model_dir, tmp_path, 3, distill=distill, optim={"lr": 1e-2})
    assert isinstance(module.teacher, TokenScorer)
    assert not any(p.requires_grad for p in module.teacher.parameters())  # frozen
    kl, reward = record.series("distill/reverse_kl"), record.series("distill/reward_mean")
    norms = record.series("ppo/grad_norm")
    assert len(kl) == len(norms) == 3
    assert kl == [0.0] * 3 and reward == [0.0] * 3 and norms == [0.0] * 3, (kl, reward, norms)
    assert record.series("reward/std") != [0.0] * 3  # the task reward varied and was left out


def test_a_teacher_that_prefers_planted_tokens_pulls_the_reverse_kl_down(tiny_model_dir, tmp_path):
    teacher = PlantedTeacher(512, planted=list(range(64, 128)))  # 0.9 on 64 of 512 tokens
    _, record = _fit(
        tiny_model_dir, tmp_path, 10, teacher=teacher,
        distill={"teacher": tiny_model_dir}, optim={"lr": 1e-2},
    )  # fmt: skip
    kl = torch.tensor(record.series("distill/reverse_kl"))
    assert len(kl) == 10
    first, last = kl[:3].mean(), kl[-3:].mean()  # measured: about 1.7 and -0.2 nats per token
    assert last < 0.5 * first, kl


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tiny_model_dir):
    module = PPOModule(
        reward=DigitFractionReward(), model="builtin:tiny-llama",
        distill={"teacher": "builtin:small-llama"},
    )  # fmt: skip
    with pytest.raises(TeacherTokenizerError) as err:
        module.configure_model()
    message = str(err.value)
    assert "'builtin:small-llama'" in message and "'builtin:tiny-llama'" in message
    assert "512 vs 2048 tokens" in message and "Fix:" in message
    assert err.value.setting == "model.init_args.distill.teacher"
    assert module.policy is None  # refused before any network loads


@pytest.mark.parametrize(
    ("distill", "match"),
    [
        ({"teacher": "t", "coef": -1.0}, r"distill.coef=-1.0 must be > 0"),
        ({"teacher": "t", "coef": 0.0}, r"distill.coef=0.0 must be > 0"),
        ({"teacher": "t", "task_reward_coef": -0.5}, r"distill.task_reward_coef=-0.5"),
        ({"teacher": "t", "discount": 1.5}, r"distill.discount=1.5 must be in \[0, 1\]"),
        ({"coef": 2.0}, r"distill.coef=2.0 is set but distill.teacher is null"),
        ({"task_reward_coef": 1.0}, r"distill.task_reward_coef=1.0 is set but"),
        ({"teacher": "t", "cof": 1.0}, r"Did you mean distill.coef\?"),
        ({"teacher_urls": ["http://h:1"]}, r"distill.teacher_urls=\['http://h:1'\] is set but"),
        ({"teacher": "t", "teacher_urls": "http://h:1"}, r"teacher_urls='http://h:1' must be null"),
        ({"teacher": "t", "teacher_urls": ["h:1"]}, r"a non-empty list of http\(s\)://HOST:PORT"),
        ({"teacher": "t", "teacher_urls": []}, r"teacher_urls=\[\] must be null or a non-empty"),
        ({"teacher": "t", "teacher_timeout_s": 0}, r"distill.teacher_timeout_s=0 must be > 0"),
    ],
)
def test_the_settings_refuse_values_that_do_nothing_or_the_opposite(distill, match):
    with pytest.raises(ValueError, match=match):
        PPOModule(reward=DigitFractionReward(), model="no/such-model", distill=distill)


def test_a_served_teacher_needs_temperature_1_and_loads_no_teacher_weights(tiny_model_dir):
    served = {"teacher": tiny_model_dir, "teacher_urls": ["http://127.0.0.1:9"]}
    with pytest.raises(ServedTeacherError, match=r"temperature 0\.7: vLLM's prompt log-probs"):
        PPOModule(reward=DigitFractionReward(), engine=HFGenerationEngine(temperature=0.7),
                  distill=served)  # fmt: skip
    module = PPOModule(reward=DigitFractionReward(), model=tiny_model_dir, distill=served)
    assert isinstance(module.teacher, ServedTeacher) and isinstance(module.teacher, TokenScorer)
    module.configure_model()  # the student loads, the served teacher's weights do not
    assert isinstance(module.teacher, ServedTeacher) and module.policy is not None


def test_pure_distillation_needs_no_group_and_mixing_does():
    one = {"samples_per_prompt": 1}
    PPOModule(reward=DigitFractionReward(), distill={"teacher": "t"}, rollout=one)
    with pytest.raises(ValueError, match=r"rollout\.samples_per_prompt=1 gives one"):
        PPOModule(
            reward=DigitFractionReward(), distill={"teacher": "t", "task_reward_coef": 1.0},
            rollout=one,
        )  # fmt: skip
    # the teacher is a frozen network: precision.reference_dtype is read for it
    PPOModule(reward=DigitFractionReward(), distill={"teacher": "t"},
              precision={"reference_dtype": "bfloat16"})  # fmt: skip
    assert DistillSettings().enabled is False


def test_distill_advantages_by_hand():
    student = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    teacher = torch.tensor([[-1.5, -1.0, -3.0, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    # k1 = student - teacher = [0.5, -1, 0, (masked)]; r = -coef * k1 = [-0.5, 1, 0, 0]
    adv, stats = distill_advantages(student, teacher, mask, coef=1.0, discount=0.0)
    assert adv.tolist() == [[-0.5, 1.0, 0.0, 0.0]]
    assert stats["distill/reverse_kl"].item() == pytest.approx((0.5 - 1.0 + 0.0) / 3)
    assert stats["distill/reward_mean"].item() == pytest.approx(0.5 / 3)
    # discount 1: the return-to-go [-0.5 + 1 + 0, 1 + 0, 0]; discount 0.5: [-0.5 + 0.5, 1, 0]
    adv, _ = distill_advantages(student, teacher, mask, coef=1.0, discount=1.0)
    assert adv.tolist() == [[0.5, 1.0, 0.0, 0.0]]
    adv, _ = distill_advantages(student, teacher, mask, coef=2.0, discount=0.5)
    assert adv.tolist() == [[0.0, 2.0, 0.0, 0.0]]


def test_the_shipped_config_runs_through_the_cli(tmp_path):
    cmd = [
        sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", str(CONFIG),
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics,) = tmp_path.glob("runs/countdown_distill_tiny/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("distill/reverse_kl")]
    assert len(rows) == 2
    assert all(float(r["distill/reverse_kl"]) > 0 for r in rows)  # a teacher that differs
