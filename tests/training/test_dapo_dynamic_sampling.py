"""DAPO's dynamic sampling (arXiv 2503.14476, sec. 3.2): every update holds exactly one batch's
number of groups, none of them with equal rewards, across rounds, a checkpoint taken between
two updates, and the round cap. (2 DDP ranks: tests/distributed/test_dapo_ddp.py.)"""

from __future__ import annotations

import re

import torch

from lit_rlhf.training.dynamic_sampling import DynamicSampler, concat_rollouts, select_rows
from lit_rlhf.types import RewardOutput, Rollout
from tests.helpers import prompt_loader
from tests.modules.test_ppo import PROMPTS, make_module, trainer

G = 4


class HalfConstantReward:
    """Groups of odd-numbered prompts all score 1 (no signal); even ones score by the length of
    the completion, so they usually differ."""

    def __call__(self, prompts, completions, rows):
        scores = []
        for prompt, completion in zip(prompts, completions, strict=True):
            number = int(re.search(r"\[(\d+),", prompt).group(1))
            scores.append(1.0 if number % 2 else (len(completion) % 3) / 2)
        return RewardOutput(torch.tensor(scores))


def _rollout(scores: list[list[float]], first_group: int = 0) -> Rollout:
    n = sum(len(g) for g in scores)
    groups = [first_group + i for i, g in enumerate(scores) for _ in g]
    full = torch.ones(n, 3, dtype=torch.bool)
    return Rollout(
        prompt_ids=torch.arange(n)[:, None].repeat(1, 3), prompt_mask=full,
        response_ids=torch.ones(n, 2, dtype=torch.long), response_mask=full[:, :2],
        sample_log_probs=None, group_ids=torch.tensor(groups), query_ids=[f"q{g}" for g in groups],
        tasks=["t"] * n, rows=[{}] * n, prompts=["p"] * n, responses=["r"] * n,
        scores=torch.tensor([s for g in scores for s in g]), reward_info={},
    )  # fmt: skip


def _groups_differ(rollout: Rollout) -> list[bool]:
    return [
        bool(rollout.scores[rollout.group_ids == g].unique().numel() > 1)
        for g in rollout.group_ids.unique()
    ]


def test_the_buffer_fills_exactly_the_target_across_rounds():
    sampler = DynamicSampler(max_rounds=5)
    # round 1: one informative group of three; round 2: two of three -> 3 >= target 2
    assert sampler.add(_rollout([[1, 1], [0, 1], [2, 2]]), target=2, pad_id=0) is None
    out = sampler.add(_rollout([[0, 0], [3, 1], [5, 4]]), target=2, pad_id=0)
    assert out is not None and len(out) == 4
    assert _groups_differ(out) == [True, True]
    assert out.query_ids == ["q1", "q1", "q1", "q1"]  # round 1's q1, then round 2's q1
    assert out.group_ids.unique().numel() == 2  # renumbered: the two q1 groups stay apart
    assert sampler.buffer == [] and sampler.rounds == 0  # the surplus group is dropped
    assert float(sampler.last_stats["rollout/dynamic_sampling_rounds"]) == 2.0


def test_the_round_cap_stops_with_the_fix():
    sampler = DynamicSampler(max_rounds=2)
    sampler.add(_rollout([[1, 1], [0, 0]]), target=2, pad_id=0)
    try:
        sampler.add(_rollout([[2, 2], [0, 0]]), target=2, pad_id=0)
    except RuntimeError as err:
        assert "holds 0 of the 2 groups" in str(err) and "Fix:" in str(err)
    else:
        raise AssertionError("the cap did not stop the run")


def test_the_buffer_survives_a_checkpoint(tmp_path):
    sampler = DynamicSampler(max_rounds=5)
    sampler.add(_rollout([[1, 0], [2, 2]]), target=2, pad_id=0)
    path = tmp_path / "state.pt"
    torch.save(sampler.state_dict(), path)
    resumed = DynamicSampler(max_rounds=5)
    resumed.load_state_dict(torch.load(path, weights_only=True))
    out = resumed.add(_rollout([[0, 3], [4, 4]], first_group=7), target=2, pad_id=0)
    assert out is not None and len(out) == 4 and _groups_differ(out) == [True, True]


def test_concat_pads_prompts_left_and_responses_right():
    a, b = _rollout([[0, 1]]), _rollout([[2, 3]])
    b = select_rows(b, torch.tensor([0, 1]))
    b.prompt_ids, b.prompt_mask = b.prompt_ids[:, :1], b.prompt_mask[:, :1]
    merged = concat_rollouts([a, b], pad_id=9)
    assert merged.prompt_ids.shape == (4, 3)
    assert merged.prompt_ids[2].tolist()[:2] == [9, 9] and not merged.prompt_mask[2, :2].any()


def _record_updates(module):
    seen = []
    prepare = module.prepare_update

    def recording(rollout):
        seen.append(rollout)
        return prepare(rollout)

    module.prepare_update = recording
    return seen


def test_ppo_updates_hold_one_batch_of_informative_groups_and_resume(tiny_model_dir, tmp_path):
    kwargs = dict(
        reward=HalfConstantReward(), rollout={"dynamic_sampling": True, "samples_per_prompt": G}
    )
    loader = prompt_loader(make_module(tiny_model_dir, **kwargs).tokenizer, PROMPTS, 4)
    first = make_module(tiny_model_dir, **kwargs)
    run = trainer(tmp_path, limit_train_batches=1)
    run.fit(first, loader)
    assert first.rl.sampler.rounds == 1 and run.global_step == 0  # half the groups: not full
    buffered = {q for r in first.rl.sampler.buffer for q in r.query_ids}
    assert buffered  # the even prompts of batch 1
    ckpt = tmp_path / "between-updates.ckpt"
    run.save_checkpoint(ckpt)
    resumed = make_module(tiny_model_dir, **kwargs)
    updates = _record_updates(resumed)
    # the checkpoint closed epoch 1 of 1: resume into a second epoch of 4 batches
    trainer(tmp_path, limit_train_batches=4, max_epochs=2).fit(resumed, loader, ckpt_path=ckpt)
    assert updates, "no update in 4 batches"
    for rollout in updates:
        assert len(rollout) == 4 * G and rollout.group_ids.unique().numel() == 4
        assert all(_groups_differ(rollout))
    assert buffered <= set(updates[0].query_ids)  # the groups from before the checkpoint
