"""Partial rollouts (``rollout.partial_rollouts`` with ``max_staleness``): the engine gets the
new weights while a request is in flight, the request finishes with tokens of two versions and
the update trains on them with the decoupled objective; per-sample staleness from the token
tags (logged exactly, the too-old samples left out); a checkpoint holds the pending generations
finished and scored; refusals. The engine is ``tests/training/partial_engine.py`` (chunked HF
generation that a push can interrupt); the CLI run uses it from a folder outside the repo."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_rlhf.envs import CountdownCalculatorEnv
from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.training.dynamic_sampling import concat_rollouts, select_rows
from lit_rlhf.training.multiturn import MultiTurnRollout
from lit_rlhf.training.partial import PartialRollouts, sample_staleness, staleness_stats
from lit_rlhf.training.reward_mask import kept_samples, rollout_rows
from lit_rlhf.training.rollouts import RolloutCollector
from lit_rlhf.types import Rollout
from tests.helpers import ConstantReward, prompt_loader, quiet_trainer
from tests.modules.test_ppo import PROMPTS, make_module
from tests.modules.test_ppo_off_policy import LoggedMetrics, _record_updates
from tests.training.partial_engine import ChunkedServingEngine
from tests.training.test_multiturn_tokens import ScriptedEngine, _batch

ROOT = Path(__file__).resolve().parents[2]
PARTIAL = {"max_staleness": 1, "partial_rollouts": True}


def _fit(tiny_model_dir, root, engine, batches=4, callbacks=(), ckpt_path=None, **kwargs):
    torch.manual_seed(0)
    module = make_module(tiny_model_dir, engine=engine, rollout=PARTIAL, **kwargs)
    updates = _record_updates(module)
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    run = quiet_trainer(root, limit_train_batches=batches, callbacks=list(callbacks))
    run.fit(module, loader, ckpt_path=ckpt_path)
    return module, updates


def test_a_request_in_flight_across_a_push_finishes_with_two_versions(tiny_model_dir, tmp_path):
    engine = ChunkedServingEngine(chunk=2, hold=True, max_new_tokens=8)
    logged = LoggedMetrics()
    module, updates = _fit(tiny_model_dir, tmp_path, engine, callbacks=[logged])
    assert len(updates) == 3 and module.rollout_step == 3  # step 0 only generates
    assert module.rl.mismatch == "tis"  # auto: the decoupled objective's weight pi_prox / mu
    assert module.rl.needs_sample_log_probs(module, 16)
    assert any(in_flight for _, in_flight in engine.pushes)  # a push landed mid-request
    assert [label for label, _ in engine.pushes] == [0, 0, 1, 2, 3]  # first push, then a step's
    mixed_updates = 0
    for t, update in enumerate(updates):  # update t (step t + 1) at weight version t
        rollout = update["experience"].rollout
        sampled = rollout.response_mask
        tags = rollout.token_versions
        assert tags is not None and rollout.sample_log_probs is not None
        assert bool((tags[sampled] >= max(t - 1, 0)).all()) and bool((tags[sampled] <= t).all())
        assert bool((tags[~sampled] == -1).all())
        mixed_updates += len(tags[sampled].unique()) == 2
        expected = staleness_stats(rollout, t, 1)
        step = logged.steps[t + 1]
        for key in ("staleness_max", "staleness_mean", "stale_token_frac", "mixed_version_frac"):
            assert step[f"rollout/{key}"] == pytest.approx(float(expected[f"rollout/{key}"]))
        assert step["rollout/stale_dropped"] == 0.0
        assert update["experience"].kept is None  # nothing too stale: every sample trained on
        assert {"time/sync_s", "time/wait_s", "time/generate_s"} <= logged.timings[t + 1].keys()
    assert mixed_updates >= 1  # the update saw samples of two versions
    assert logged.steps[-1]["rollout/mixed_version_frac"] > 0
    assert logged.steps[-1]["rollout/mismatch_abs_log_ratio"] > 0  # mu of older weights


def _rollout(tags: list[list[int]], mask: list[list[int]], groups: list[int], version=3):
    n, r = len(tags), len(tags[0])
    return Rollout(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.ones(n, r, dtype=torch.long),
        response_mask=torch.tensor(mask, dtype=torch.bool),
        sample_log_probs=torch.zeros(n, r),
        group_ids=torch.tensor(groups),
        query_ids=["q"] * n,
        tasks=["t"] * n,
        rows=[{}] * n,
        prompts=["p"] * n,
        responses=["r"] * n,
        scores=torch.arange(n, dtype=torch.float32),
        reward_info={},
        weight_version=version,
        token_versions=torch.tensor(tags),
    )


def test_staleness_metrics_are_exact_on_a_constructed_rollout():
    rollout = _rollout(
        tags=[[3, 3, 4, -1], [5, 5, 5, 5], [2, 4, -1, -1], [-1, -1, -1, -1]],
        mask=[[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]],
        groups=[0, 0, 1, 1],
    )  # the last sample's one token is untagged: its staleness is by submission (version 3)
    assert sample_staleness(rollout, 5).tolist() == [2, 0, 3, 2]
    stats = {k: float(v) for k, v in staleness_stats(rollout, 5, max_staleness=2).items()}
    assert stats == {
        "rollout/staleness_mean": 1.75,
        "rollout/staleness_max": 3.0,
        "rollout/stale_token_frac": pytest.approx(5 / 9),  # 3 + 0 + 2 of 3 + 4 + 2 tagged
        "rollout/mixed_version_frac": 0.5,  # samples 0 and 2
        "rollout/stale_dropped": 1.0,  # sample 2 (3 > 2)
        "rollout/staleness": 2.0,  # by submission: 5 - 3
    }
    untagged = _rollout([[-1]] * 2, [[1]] * 2, [0, 0], version=4)
    untagged.token_versions = None  # an engine that tags nothing: the submission version
    assert sample_staleness(untagged, 5).tolist() == [1, 1]


def test_the_per_sample_bound_leaves_out_exactly_the_too_old_samples(tiny_model_dir, tmp_path):
    engine = ChunkedServingEngine(chunk=4, max_new_tokens=8)
    module, updates = _fit(tiny_model_dir, tmp_path, engine, batches=2)
    rollout = updates[0]["experience"].rollout  # a real rollout: 4 prompts x 4 samples
    sampled = rollout.response_mask
    oldest = torch.tensor([6, 6, 4, 6, 5, 6, 6, 6, 3, 3, 3, 6, 6, 6, 6, 2])  # per sample
    rollout.token_versions = torch.where(sampled, oldest[:, None], -1)
    rollout.token_versions[:, 1:] = torch.where(sampled[:, 1:], 6, -1)  # later tokens: newer
    module.rollout_step = 6  # updating version 6 with max_staleness 1: staleness > 1 is left out
    too_old = [2, 8, 9, 10, 15]
    assert module.rl.overlap.left_out(rollout, 6).nonzero().squeeze(1).tolist() == too_old
    experience = module.rl.prepare(module, rollout)
    # grpo: group 2 keeps one sample (11), which has no baseline and leaves with its mates
    assert (~experience.kept).nonzero().squeeze(1).tolist() == [*too_old[:4], 11, 15]
    assert not experience.counted[[2, 8, 9, 10, 11, 15]].any()
    assert experience.counted[0].any() and bool(experience.advantages[too_old].eq(0).all())
    stats = staleness_stats(rollout, 6, 1)
    assert float(stats["rollout/stale_dropped"]) == len(too_old)
    no_mates = kept_samples(rollout, "reinforce_pp", module.rl.overlap.left_out(rollout, 6))
    assert (~no_mates).nonzero().squeeze(1).tolist() == too_old


def test_a_checkpoint_with_pending_generations_restores_the_same_rollouts(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "pending.ckpt"
    saved = LoggedMetrics(save_at=1, path=ckpt)  # after step 1: batch 1 still generating
    _, updates = _fit(tiny_model_dir, tmp_path, ChunkedServingEngine(max_new_tokens=8),
                      callbacks=[saved])  # fmt: skip
    queue = torch.load(ckpt, weights_only=False)["lit_rlhf"]["overlap"]["queue"]
    assert len(queue) == 1 and queue[0]["token_versions"] is not None  # finished and scored
    resumed_module, resumed = _fit(
        tiny_model_dir, tmp_path, ChunkedServingEngine(max_new_tokens=8), ckpt_path=ckpt
    )
    before, after = updates[1]["experience"].rollout, resumed[0]["experience"].rollout
    for name in ("response_ids", "token_versions", "sample_log_probs", "scores", "prompt_ids"):
        assert torch.equal(getattr(before, name), getattr(after, name)), name
    assert before.weight_version == after.weight_version == 0  # submitted at step 1, no update
    assert torch.equal(after.token_versions, torch.as_tensor(queue[0]["token_versions"]))
    assert resumed and resumed_module.rollout_step == 1 + len(resumed)  # 1 in the checkpoint


def test_partial_rollouts_without_staleness_are_refused(tiny_model_dir):
    message = r"max_staleness >= 1 \(got 0\)\. Fix: set rollout.max_staleness: 1"
    with pytest.raises(ValueError, match=message):
        make_module(tiny_model_dir, rollout={"partial_rollouts": True})


def test_an_engine_without_partial_rollouts_is_refused_at_setup(tiny_model_dir, tmp_path):
    module = make_module(tiny_model_dir, rollout=PARTIAL)  # HFGenerationEngine
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    with pytest.raises(ValueError) as refused:
        quiet_trainer(tmp_path, limit_train_batches=2).fit(module, loader)
    message = str(refused.value)
    assert "lit_rlhf.rollout.hf.HFGenerationEngine does not keep requests" in message
    assert "Fix: use an engine that has both" in message and "partial_rollouts: false" in message
    vllm_like = SimpleNamespace(serves_own_weights=True, enable_sleep_mode=False, truncates=False)
    with pytest.raises(ValueError, match="lacks supports_partial_rollouts"):
        PartialRollouts(1).check(SimpleNamespace(strategy=None, world_size=1), vllm_like)
    PartialRollouts(1).check(SimpleNamespace(strategy=None, world_size=1), ChunkedServingEngine())
    with pytest.raises(ValueError, match="make no update"):  # one-step-off's checks still apply
        PartialRollouts(1).check(
            SimpleNamespace(strategy=None, world_size=1, fast_dev_run=1), ChunkedServingEngine()
        )


def test_a_ppo_run_with_partial_rollouts_through_the_cli(tmp_path):
    """``lit-rlhf fit`` of the tiny Countdown config with a user's engine class from a folder
    outside the repository: the partial-rollout metrics land in the CSV log."""
    assert ROOT not in tmp_path.parents
    source = (ROOT / "tests" / "training" / "partial_engine.py").read_text()
    (tmp_path / "my_engine.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [
        str(Path(sys.executable).parent / "lit-rlhf"), "fit",
        "--config", str(ROOT / "configs" / "ppo" / "countdown_tiny.yaml"),
        "--model.init_args.engine=my_engine.ChunkedServingEngine",
        "--model.init_args.engine.init_args.chunk=4",
        "--model.init_args.rollout.partial_rollouts=true",
        "--model.init_args.rollout.max_staleness=1",
        "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    updated = [row for row in rows if row.get("rollout/staleness_max")]
    assert len(updated) == 2  # 3 batches: the first only generates
    for row in updated:
        assert float(row["rollout/staleness_max"]) <= 1.0
        assert float(row["rollout/stale_dropped"]) == 0.0
        assert 0.0 <= float(row["rollout/stale_token_frac"]) <= 1.0
        assert 0.0 <= float(row["rollout/mixed_version_frac"]) <= 1.0
    synced = [row for row in rows if row.get("time/sync_s")]
    assert len(synced) == 3 and all(float(row["time/wait_s"]) >= 0 for row in synced)


def test_token_versions_are_carried_by_the_collector_and_the_rollout_helpers():
    tokenizer = load_tokenizer("builtin:tiny-llama")

    class Tagging(ScriptedEngine):  # tags call c's tokens with version 10 + c
        def generate(self, *args, **kwargs):
            out = super().generate(*args, **kwargs)
            out.token_versions = torch.full_like(out.response_ids, 10 + len(self.inputs) - 1)
            out.token_versions = out.token_versions.masked_fill(~out.response_mask, -1)
            return out

    eos = tokenizer.eos_token_id
    turn1 = [*tokenizer("<tool>calculator: 3*(4+5)</tool>", add_special_tokens=False)[
        "input_ids"], eos]  # fmt: skip
    turn2 = [*tokenizer("<answer>3*(4+5)</answer>", add_special_tokens=False)["input_ids"], eos]
    policy = load_causal_lm("builtin:tiny-llama")
    loop = MultiTurnRollout(CountdownCalculatorEnv(), EnvironmentSettings(max_turns=3))
    collector = RolloutCollector(Tagging([[turn1], [turn2]]), ConstantReward(1.0), multiturn=loop)
    episode = collector.collect(policy, tokenizer, _batch(tokenizer), samples_per_prompt=1)
    tags, agent = episode.token_versions[0], episode.agent_mask[0]
    n1, n = len(turn1), int(episode.response_mask[0].sum())
    assert tags[:n1].tolist() == [10] * n1 and tags[n - len(turn2) : n].eq(11).all()
    assert tags[~agent].eq(-1).all()  # the environment's tokens and the padding: untagged
    single = RolloutCollector(Tagging([[turn2] * 4]), ConstantReward(1.0))
    rollout = single.collect(policy, tokenizer, _batch(tokenizer, 2), samples_per_prompt=2)
    assert rollout.token_versions.shape == rollout.response_ids.shape
    assert rollout.token_versions[rollout.response_mask].eq(10).all()
    rollout.weight_version = 10
    part = select_rows(rollout, torch.tensor([3, 0]))
    assert torch.equal(part.token_versions, rollout.token_versions[[3, 0]])
    part.token_versions = part.token_versions[:, :2]
    part.response_ids, part.response_mask = part.response_ids[:, :2], part.response_mask[:, :2]
    part.weight_version = 9
    merged = concat_rollouts([rollout, part], pad_id=0)
    assert merged.weight_version == 9 and merged.token_versions[4:, 2:].eq(-1).all()
    assert torch.equal(merged.token_versions[:4], rollout.token_versions)
    picked = rollout_rows(rollout, torch.tensor([1]))
    assert torch.equal(picked.token_versions, rollout.token_versions[[1]])


def test_a_resumed_run_relabels_an_engine_that_validation_started():
    """Validation before the first step of a run resumed at version 3 started the engine (label
    0): the first step pushes the weights again, labelled 3, before it submits."""
    policy = load_causal_lm("builtin:tiny-llama")
    engine = ChunkedServingEngine(max_new_tokens=4)
    engine.generate(policy, torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), _Tok())
    overlap = PartialRollouts(1)
    with overlap.step(policy, engine, 3, lambda model: engine.served_version, None) as ready:
        assert ready is None  # the queue fills
    assert [label for label, _ in engine.pushes] == [0, 3, 3]  # started, relabelled, the step's
    assert overlap.pending[0].future.result()[0] == 3  # generated under the relabelled weights
    overlap.close()


class _Tok:
    pad_token_id, eos_token_id = 0, 1
