"""A sample whose reward raised (``GuardedReward(on_error='mask')``) leaves the update: its group's
statistics are those of the remaining samples (hand-computed below), it has no weight in the
loss, a group left with one sample is dropped, and a batch with nothing left makes no optimizer
step (warned, ``fault/empty_update``). ``on_error='fallback'`` trains on the fallback score."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import lightning as L
import pytest
import torch

from lit_rlhf.algos import (
    gae,
    group_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    token_level_rewards,
)
from lit_rlhf.rewards import GuardedReward, WeightedRewards
from lit_rlhf.rewards.guarded import REWARD_MASKED_KEY, failed_samples
from lit_rlhf.settings import AdvantageSettings
from lit_rlhf.training import PPOSettings, PPOUpdate
from lit_rlhf.training.dynamic_sampling import DynamicSampler
from lit_rlhf.training.experience import build_experience, compute_advantages
from lit_rlhf.training.reward_mask import kept_advantages, kept_samples, rollout_rows
from lit_rlhf.types import RewardOutput, Rollout
from tests.helpers import prompt_loader
from tests.modules.test_ppo import PROMPTS, make_module, trainer

S3 = math.sqrt(1 / 3)  # the unbiased std of {1, 0, 1} and of {0, 1, 0, 1}


def rollout(scores: list[float], failed: list[int] | None, group_size: int = 4) -> Rollout:
    """A rollout of len(scores) two-token responses in groups of ``group_size``;
    ``failed``: the samples a masking GuardedReward failed on (None: no masking reward)."""
    n = len(scores)
    ids, mask = torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.bool)
    info: dict[str, torch.Tensor] = {}
    if failed is not None:
        info[REWARD_MASKED_KEY] = torch.zeros(n)
        info[REWARD_MASKED_KEY][failed] = 1.0
    return Rollout(
        prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask,
        sample_log_probs=None, group_ids=torch.arange(n) // group_size,
        query_ids=["q"] * n, tasks=["t"] * n, rows=[{}] * n, prompts=[""] * n,
        responses=[""] * n, scores=torch.tensor(scores), reward_info=info,
    )  # fmt: skip


def experience(ro: Rollout, estimator: str) -> Any:
    settings = PPOSettings(advantage=AdvantageSettings(estimator=estimator))
    return build_experience(
        ro, policy=None, settings=settings, temperature=1.0, kl_coef=0.0, use_current_as_old=True
    )  # type: ignore[arg-type]


# group 0: sample 2 failed (its placeholder 9.0 must not count); group 1: three of four failed,
# one survivor left, dropped; group 2: untouched
SCORES = [1.0, 0.0, 9.0, 1.0, 9.0, 0.5, 9.0, 9.0, 0.0, 1.0, 0.0, 1.0]
FAILED = [2, 4, 6, 7]


def test_grpo_statistics_are_those_of_the_remaining_samples() -> None:
    exp = experience(rollout(SCORES, FAILED), "grpo")
    # group 0 over {1, 0, 1}: mean 2/3, std sqrt(1/3); group 2 over {0, 1, 0, 1}: mean 1/2
    expected = [1 / 3 / S3, -2 / 3 / S3, 0, 1 / 3 / S3, 0, 0, 0, 0, *[-0.5 / S3, 0.5 / S3] * 2]
    torch.testing.assert_close(exp.advantages[:, 0], torch.tensor(expected), atol=1e-5, rtol=0)
    kept = [True, True, False, True, False, False, False, False] + [True] * 4
    assert exp.kept.tolist() == kept  # the failed ones and group 1's lone survivor (sample 5)
    assert exp.counted.any(1).tolist() == kept  # out of every loss term and token count


def test_rloo_leaves_one_out_of_the_remaining_samples() -> None:
    exp = experience(rollout(SCORES, FAILED), "rloo")
    # group 0: 1 - (0 + 1) / 2, 0 - (1 + 1) / 2, ...; group 2: 0 - 2/3, 1 - 1/3, ...
    expected = [0.5, -1.0, 0, 0.5, 0, 0, 0, 0, *[-2 / 3, 2 / 3] * 2]
    torch.testing.assert_close(exp.advantages[:, 0], torch.tensor(expected), atol=1e-6, rtol=0)


def test_reinforce_pp_whitens_over_the_remaining_samples_only() -> None:
    ro = rollout(SCORES, FAILED)
    exp = experience(ro, "reinforce_pp")
    kept = torch.tensor([i not in FAILED for i in range(len(SCORES))])  # no group is dropped
    alone = reinforce_pp_advantages(ro.scores[kept], ro.response_mask[kept])
    torch.testing.assert_close(exp.advantages[kept], alone)
    assert exp.kept.tolist() == kept.tolist() and not exp.advantages[~kept].any()


def test_gae_whitens_over_the_remaining_samples_only() -> None:
    ro, values = rollout(SCORES, FAILED), torch.randn(len(SCORES), 2)
    settings = PPOSettings(advantage=AdvantageSettings(estimator="gae", whiten=True))
    kept = kept_samples(ro, "gae")
    assert kept is not None and kept.tolist() == [i not in FAILED for i in range(len(SCORES))]
    compute = partial(compute_advantages, settings=settings, kl_coef=0.0)
    adv, returns = kept_advantages(
        kept, compute, ro, old_log_probs=None, ref_log_probs=None, values=values
    )
    mask = ro.response_mask[kept]
    rewards = token_level_rewards(ro.scores[kept], mask)
    alone, alone_returns = gae(rewards, values[kept], mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv[kept], masked_whiten(alone, mask))
    torch.testing.assert_close(returns[kept], alone_returns)
    assert not adv[~kept].any() and not returns[~kept].any()


def test_fallback_mode_trains_on_the_fallback_score() -> None:
    ro = rollout(SCORES, None)  # no reward_masked column: every score counts, 9.0 included
    exp = experience(ro, "grpo")
    assert exp.kept is None
    torch.testing.assert_close(exp.advantages[:, 0], group_advantages(ro.scores, ro.group_ids))


class FlakyReward:
    """Score = the completion's distinct characters / 10 (varied, so advantages are not 0); the
    batch call raises whenever any sample is to fail, and so does the k-th single-sample call
    for k in ``fail`` (GuardedReward re-scores the batch sample by sample, in order).
    ``fail=None``: every call raises."""

    def __init__(self, fail: set[int] | None) -> None:
        self.fail, self.single = fail, 0

    def __call__(self, prompts: Any, completions: Sequence[str], rows: Any) -> RewardOutput:
        if len(completions) > 1:
            if self.fail is None or self.fail:
                raise ConnectionError("verifier unreachable")
        else:
            k, self.single = self.single, self.single + 1
            if self.fail is None or k in self.fail:
                raise ConnectionError("verifier unreachable")
        return RewardOutput(torch.tensor([len(set(x)) / 10 for x in completions]))


def test_one_failed_part_of_weighted_rewards_masks_the_whole_sample() -> None:
    reward = WeightedRewards(
        [GuardedReward(FlakyReward({1}), timeout_s=None), lambda p, c: [1.0] * len(c)]
    )
    with pytest.warns(RuntimeWarning, match="sample 1 of the batch failed"):
        out = reward(["p"] * 3, ["1", "2", "3"], [{}] * 3)
    assert failed_samples(out.info, 3).tolist() == [False, True, False]


def _module_experience(tiny_model_dir: str, fail: set[int], **kwargs: Any) -> tuple[Any, Any]:
    reward = GuardedReward(FlakyReward(fail), timeout_s=None)
    module = make_module(tiny_model_dir, reward=reward, **kwargs)
    module.configure_model()
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)
    batch = next(iter(prompt_loader(module.tokenizer, PROMPTS[:4], 4)))
    torch.manual_seed(0)
    with pytest.warns(RuntimeWarning, match="left out of the update"):
        return module, module.prepare_update(module.collect_rollout(batch))


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_a_failed_sample_has_no_weight_in_the_loss(tiny_model_dir, loss_agg: str) -> None:
    # groups of 4: one failure in group 0 and one in group 1
    module, exp = _module_experience(tiny_model_dir, {1, 6}, loss={"loss_agg": loss_agg})
    kept = exp.kept.clone()
    assert (~kept).nonzero().squeeze(1).tolist() == [1, 6]

    def gradient(rows: list[int]) -> torch.Tensor:
        """The policy's gradient of the loss of the mini-batch ``rows`` (GRPO's advantages sum
        to 0 over a group, so a sequence-mean loss is ~0 itself: its gradient is compared)."""
        update = PPOUpdate(
            module.policy, module.settings, exp, temperature=1.0, kl_coef=0.0,
            use_current_as_old=True,
        )  # fmt: skip
        module.policy.zero_grad()
        for micro in update.micro_batches(torch.tensor(rows)):  # accumulated, as one step does
            update.loss(micro).backward()
        return torch.cat([p.grad.flatten() for p in module.policy.parameters()])

    masked = gradient(list(range(len(exp))))
    assert masked.abs().sum() > 0
    exp.kept = None
    alone = gradient(kept.nonzero().squeeze(1).tolist())  # the kept rows as their own batch
    torch.testing.assert_close(masked, alone, atol=1e-7, rtol=1e-5)
    exp.advantages[1] = 100.0  # what a failed row holds cannot reach the loss
    exp.kept = kept
    torch.testing.assert_close(gradient(list(range(len(exp)))), masked)


def test_training_goes_on_and_counts_the_masked_samples(tiny_model_dir, tmp_path) -> None:
    module = make_module(
        tiny_model_dir, reward=GuardedReward(FlakyReward({0, 1, 2}), timeout_s=None)
    )
    module.configure_model()
    before = [p.detach().clone() for p in module.policy.parameters()]
    run = trainer(tmp_path, limit_train_batches=1)
    with pytest.warns(RuntimeWarning, match="left out of the update"):
        run.fit(module, prompt_loader(module.tokenizer, PROMPTS[:4], 4))
    logged = run.logged_metrics
    # samples 0-2 failed: group 0 is left with one sample and dropped (4 out of the update)
    assert float(logged["fault/reward_errors"]) == 3.0
    assert float(logged["fault/reward_masked"]) == 4.0
    assert float(logged["fault/empty_update"]) == 0.0 and run.global_step == 1
    assert any(
        not torch.equal(p, b) for p, b in zip(module.policy.parameters(), before, strict=True)
    )


def test_a_batch_with_nothing_left_makes_no_optimizer_step(tiny_model_dir, tmp_path) -> None:
    module = make_module(tiny_model_dir, reward=GuardedReward(FlakyReward(None), timeout_s=None))
    module.configure_model()
    before = [p.detach().clone() for p in module.policy.parameters()]
    run = trainer(tmp_path, limit_train_batches=2)  # max_failed_batches=3: no error yet
    with pytest.warns(RuntimeWarning, match="no update this step") as caught:
        run.fit(module, prompt_loader(module.tokenizer, PROMPTS[:8], 4))
    assert sum("no update this step" in str(w.message) for w in caught) == 2
    assert run.global_step == 0 and module.rollout_step == 2
    assert all(torch.equal(p, b) for p, b in zip(module.policy.parameters(), before, strict=True))
    assert float(run.logged_metrics["fault/empty_update"]) == 1.0
    assert float(run.logged_metrics["fault/reward_masked"]) == 16.0  # 4 prompts x 4 samples


def test_dynamic_sampling_judges_a_group_by_its_scored_samples() -> None:
    # group 0 differs only through its failed sample's placeholder: it carries no signal
    ro = rollout([1.0, 1.0, 9.0, 1.0, 0.0, 1.0, 0.0, 1.0], [2])
    update = DynamicSampler(max_rounds=2).add(ro, target=1, pad_id=0)
    assert update is not None and update.scores.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_the_remaining_samples_keep_their_multi_turn_fields() -> None:
    ro = rollout([0.0, 1.0, 2.0, 3.0], None)
    ro.agent_mask = torch.tensor([[True, False]] * 4)
    ro.turn_ends = torch.tensor([[0, -1], [0, 1], [1, -1], [0, 1]])
    ro.turn_rewards = torch.arange(8.0).reshape(4, 2)
    ro.cut = torch.tensor([False, True, False, False])
    ro.term_stats = {"env/turns": torch.tensor(1.5)}
    part = rollout_rows(ro, torch.tensor([3, 1]))
    assert part.scores.tolist() == [3.0, 1.0] and part.responses == ["", ""]
    assert part.turn_ends.tolist() == [[0, 1], [0, 1]] and part.cut.tolist() == [False, True]
    assert part.turn_rewards.tolist() == [[6.0, 7.0], [2.0, 3.0]]
    assert part.agent_mask.shape == (2, 2) and float(part.term_stats["env/turns"]) == 1.5
