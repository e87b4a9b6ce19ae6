"""One-step-off (``max_staleness``) training: 0 is the on-policy path bitwise; with k = 1 batch
t + 1 is sampled in a worker thread from the weights before update t, while that update runs;
the decoupled objective's importance weights pi_prox / mu are applied (checked against a
gradient computed by hand); a kill-and-resume is exact. (vLLM: tests/rollout/test_vllm_stale.py;
the overlap benchmark: scripts/bench/overlap.py.)"""

from __future__ import annotations

import copy
import threading
import time
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.models.forward import forward_response
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import DeepSpeedStrategy
from lit_rlhf.training.overlap import OverlappedRollouts
from lit_rlhf.types import RewardOutput
from tests.helpers import prompt_loader, quiet_trainer
from tests.modules.test_ppo import PROMPTS, make_module


def _zero3():
    strategy = DeepSpeedStrategy.__new__(DeepSpeedStrategy)  # no DeepSpeed setup: a type check
    strategy.config = {"zero_optimization": {"stage": 3}}
    return strategy


def _vllm_like(**flags):
    defaults = {"serves_own_weights": True, "enable_sleep_mode": False, "truncates": False}
    return SimpleNamespace(**{**defaults, **flags})


def _fingerprint(model: torch.nn.Module) -> tuple[float, float]:
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    return float(flat.sum()), float(flat.square().sum())


class SpyEngine(HFGenerationEngine):
    """Records, per generate call: the thread, the time span and the weights it sampled with;
    ``delay`` seconds of extra work make the generation outlast the tiny model's update."""

    def __init__(self, delay: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.delay, self.calls = delay, []

    def generate(self, model, input_ids, attention_mask, tokenizer, **kwargs):
        start, weights = time.perf_counter(), _fingerprint(model)
        out = super().generate(model, input_ids, attention_mask, tokenizer, **kwargs)
        time.sleep(self.delay)
        self.calls.append(
            dict(thread=threading.current_thread(), start=start, end=time.perf_counter(),
                 weights=weights, prompts=input_ids.clone())
        )  # fmt: skip
        return out


def _record_updates(module):
    """Wraps ``module.rl.optimize``: per update its time span, the policy's weights before it,
    the rollout's prompts and weight version, and a copy of the policy and experience."""
    seen, optimize = [], module.rl.optimize

    def recording(mod, experience):
        entry = dict(start=time.perf_counter(), weights=_fingerprint(mod.policy))
        entry.update(policy=copy.deepcopy(mod.policy), experience=experience)
        out = optimize(mod, experience)
        entry["end"] = time.perf_counter()
        seen.append(entry)
        return out

    module.rl.optimize = recording
    return seen


class LoggedMetrics(L.Callback):
    """Every training batch's logged metrics (and gradients before each optimizer step)."""

    def __init__(self, save_at=None, path=None):
        self.steps, self.grads, self.save_at, self.path = [], [], save_at, path
        self.timings = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.grads.append({n: p.grad.clone() for n, p in module.policy.named_parameters()})

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        metrics = trainer.logged_metrics.items()  # wall-clock timings aside
        self.steps.append({k: float(v) for k, v in metrics if not _timing(k)})
        self.timings.append({k: float(v) for k, v in metrics if _timing(k)})
        if batch_idx == self.save_at:
            trainer.save_checkpoint(self.path)


def _timing(key: str) -> bool:
    return key.startswith(("time/", "perf/")) or key == "rollout/overlap"


class LengthReward:
    """Scores vary within every group (the tiny model's completions have random lengths)."""

    def __call__(self, prompts, completions, rows):
        return RewardOutput(torch.tensor([(len(c) % 5) / 4 for c in completions]))


def _fit(tiny_model_dir, root, batches=4, callbacks=(), **kwargs):
    torch.manual_seed(0)
    module = make_module(tiny_model_dir, **kwargs)
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    run = quiet_trainer(root, limit_train_batches=batches, callbacks=list(callbacks))
    run.fit(module, loader)
    return module, run


def test_max_staleness_zero_is_the_on_policy_path_bitwise(tiny_model_dir, tmp_path):
    runs = []
    for kwargs in ({}, {"rollout": {"max_staleness": 0}}):
        logged = LoggedMetrics()
        module, _ = _fit(tiny_model_dir, tmp_path, callbacks=[logged], **kwargs)
        runs.append((logged.steps, module.policy.state_dict()))
    (steps_a, weights_a), (steps_b, weights_b) = runs
    assert len(steps_a) == 4 and steps_a == steps_b  # every metric, bitwise
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert module.rl.overlap is None


def test_one_step_off_samples_batch_t_plus_1_with_the_weights_before_update_t(
    tiny_model_dir, tmp_path
):
    engine = SpyEngine(delay=0.3, max_new_tokens=8)
    logged = LoggedMetrics()
    module = make_module(tiny_model_dir, engine=engine, rollout={"max_staleness": 1})
    updates = _record_updates(module)
    torch.manual_seed(0)
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    run = quiet_trainer(tmp_path, limit_train_batches=4, callbacks=[logged])
    run.fit(module, loader)
    gens = engine.calls
    assert len(gens) == 4 and len(updates) == 3  # step 0 only generates
    assert run.global_step == 3 and module.rollout_step == 3
    for t, update in enumerate(updates):  # update t (at step t + 1) trains on batch t
        rollout = update["experience"].rollout
        assert torch.equal(rollout.prompt_ids, gens[t]["prompts"])
        assert rollout.weight_version == max(t - 1, 0)  # sampled before update t - 1 ran
        nxt = gens[t + 1]  # batch t + 1 was sampled with the weights before update t ...
        assert nxt["weights"] == update["weights"]
        assert nxt["thread"] is not threading.main_thread()
        # ... and while update t ran
        assert nxt["start"] < update["end"] and nxt["end"] > update["start"]
    assert updates[1]["weights"] != updates[2]["weights"]  # the updates moved the weights
    assert logged.steps[-1]["rollout/staleness"] == 1.0
    assert logged.timings[-1]["rollout/overlap"] > 0  # the share of generation beside the update
    assert logged.steps[-1]["rollout/mismatch_abs_log_ratio"] > 0  # stale mu != pi_prox
    assert module.rl.mismatch == "tis"  # auto: the decoupled objective's weight
    assert logged.steps[-1]["rollout/mismatch_weight_mean"] != 1.0  # the weights are logged


def test_off_policy_importance_weights_are_applied_reference(tiny_model_dir, tmp_path):
    """The gradient of update 2 equals the decoupled PPO objective's, computed by hand: token
    mean of -A * (pi / pi_prox) * min(pi_prox / mu, cap), mu the stale engine's log-probs."""
    logged = LoggedMetrics()
    module = make_module(
        tiny_model_dir,
        rollout={"max_staleness": 1},
        optim={"lr": 5e-2, "max_grad_norm": None, "micro_batch_size": 16},
        mismatch={"cap": 1.5},
    )
    updates = _record_updates(module)
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    torch.manual_seed(0)
    quiet_trainer(tmp_path, limit_train_batches=3, callbacks=[logged]).fit(module, loader)
    update, grads = updates[-1], logged.grads[-1]
    exp, policy = update["experience"], update["policy"]
    ro = exp.rollout
    out = forward_response(
        policy, ro.input_ids, ro.attention_mask, ro.response_ids, temperature=1.0
    )
    mask = exp.counted
    prox = out.log_probs.detach()
    weights = torch.exp(prox - ro.sample_log_probs).clamp(max=1.5)
    assert (weights - 1).abs()[mask].max() > 1e-3, "mu equals pi_prox: nothing to correct"
    per_token = -exp.advantages * torch.exp(out.log_probs - prox)

    def grad_of(w):
        policy.zero_grad()
        ((per_token * w * mask).sum() / mask.sum()).backward(retain_graph=True)
        return {n: p.grad.clone() for n, p in policy.named_parameters()}

    expected, unweighted = grad_of(weights), grad_of(torch.ones_like(weights))
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6)
    differs = [not torch.allclose(grads[n], unweighted[n], atol=1e-6) for n in grads]
    assert any(differs), "the weights changed nothing: the reference test would not notice"


def _fit_countdown(model_dir, root, callback, ckpt_path=None):
    torch.manual_seed(0)
    data = PromptDataModule(
        tokenizer=model_dir, train=CountdownPrompts(num_examples=12, seed=0), batch_size=2,
        use_chat_template=False,
    )  # fmt: skip
    module = PPOModule(
        reward=LengthReward(),
        model=model_dir,
        tokenizer=data.tokenizer,
        optim={"lr": 1e-3},
        engine=HFGenerationEngine(max_new_tokens=6),
        rollout={"samples_per_prompt": 2, "max_staleness": 1},
    )
    run = quiet_trainer(root, max_epochs=1, num_sanity_val_steps=0, callbacks=[callback])
    run.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize("at", [0, 3], ids=["queue-filling", "mid-run"])
def test_off_policy_kill_and_resume_is_exact(tiny_model_dir, tmp_path, at):
    ckpt = tmp_path / "stale.ckpt"
    full = LoggedMetrics(save_at=at, path=ckpt)
    full_module = _fit_countdown(tiny_model_dir, tmp_path, full)
    assert len(full.steps) == 6 and full_module.rollout_step == 5
    assert torch.load(ckpt, weights_only=False)["lit_rlhf"]["overlap"]["queue"]  # in flight
    again = LoggedMetrics()
    module = _fit_countdown(tiny_model_dir, tmp_path, again, ckpt_path=ckpt)
    assert again.steps == full.steps[at + 1 :]  # every logged metric after the kill, bitwise
    assert any(step["reward/std"] > 0 for step in again.steps)  # the updates had a signal
    final, expected = module.policy.state_dict(), full_module.policy.state_dict()
    assert all(torch.equal(final[k], expected[k]) for k in expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rollout={"max_staleness": -1}), "max_staleness=-1 must be >= 0"),
        (
            dict(rollout={"max_staleness": 1}, mismatch={"correction": "none"}),
            "mismatch.correction: tis",
        ),
        (
            dict(rollout={"max_staleness": 1}, update={"ppo_epochs": 2}),
            "recompute_old_log_probs: true",
        ),
        (dict(rollout={"max_staleness": 1, "dynamic_sampling": True}), "dynamic_sampling: false"),
    ],
    ids=["negative", "no-importance-weight", "no-proximal-log-probs", "dynamic-sampling"],
)
def test_off_policy_settings_are_refused_with_the_fix(tiny_model_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_module(tiny_model_dir, **kwargs)


@pytest.mark.parametrize(
    ("trainer", "engine", "message"),
    [
        (SimpleNamespace(strategy=_zero3(), world_size=1), HFGenerationEngine(), "snapshot copy"),
        (SimpleNamespace(strategy=None, world_size=2), HFGenerationEngine(), "synced_gpus: false"),
        (SimpleNamespace(strategy=None, world_size=1), _vllm_like(enable_sleep_mode=True),
         "enable_sleep_mode: false"),
        (SimpleNamespace(strategy=None, world_size=1), _vllm_like(truncates=True), "top_k: 0"),
        (SimpleNamespace(strategy=None, world_size=1, fast_dev_run=1), HFGenerationEngine(),
         "make no update. Fix: fast_dev_run: 2"),
        (SimpleNamespace(strategy=None, world_size=1, fast_dev_run=True), HFGenerationEngine(),
         "fast_dev_run=1 with max_staleness=1"),
    ],
    ids=["zero3-snapshot", "ddp-lockstep", "vllm-sleep", "vllm-truncated-log-probs",
         "fast-dev-run-1", "fast-dev-run-true"],
)  # fmt: skip
def test_off_policy_setups_that_cannot_overlap_are_refused_at_setup(trainer, engine, message):
    with pytest.raises(ValueError, match=message):
        OverlappedRollouts(1).check(trainer, engine)
    OverlappedRollouts(1).check(SimpleNamespace(strategy=None, world_size=1), HFGenerationEngine())
    OverlappedRollouts(1).check(  # two batches: one update
        SimpleNamespace(strategy=None, world_size=1, fast_dev_run=2), HFGenerationEngine()
    )
