"""``OptimizerStep(clip_grad_per_group=True)`` / ``PPOModule(clip_per_network=True)``: each param
group's gradient norm clipped on its own, as verl clips the actor and the critic with their own
optimizers (the TRE authors' recipe, arXiv 2602.03635); refused where it cannot be done."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies.deepspeed_cpu import CPUDeepSpeedStrategy
from lit_rlhf.training import OptimizerStep
from lit_rlhf.types import RewardOutput
from tests.helpers import ConstantReward, prompt_loader, quiet_trainer


class TwoGroups(L.LightningModule):
    """Loss ``3 a0 + 4 a1 + 12 b`` (times ``scale``): constant gradients a = [3, 4], b = [12]."""

    def __init__(self, per_group: bool, scale: float = 1.0) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
        self.scale = scale
        self.step_optimizer = OptimizerStep(max_grad_norm=1.0, clip_grad_per_group=per_group)

    def configure_optimizers(self):
        groups = [{"params": [self.a], "name": "a"}, {"params": [self.b], "name": "b"}]
        return torch.optim.SGD(groups, lr=1.0)

    def training_step(self, batch, batch_idx):
        def loss(_):
            return self.scale * (3 * self.a[0] + 4 * self.a[1] + 12 * self.b[0])

        self.stats = self.step_optimizer(self, self.optimizers(), [0], loss)


def _fit(tmp_path, module):
    quiet_trainer(tmp_path, max_steps=1).fit(module, DataLoader(torch.zeros(1, 1)))
    return module.a.detach().tolist() + module.b.detach().tolist()


def test_per_group_clip_differs_from_the_joint_clip_by_hand(tmp_path):
    # gradients a = [3, 4] (norm 5), b = [12] (norm 12); joint norm sqrt(25 + 144) = 13.
    # joint clip to 1: every entry / 13 -> a = [3/13, 4/13], b = [12/13];
    # per group: a / 5 -> [0.6, 0.8], b / 12 -> [1.0]. SGD lr 1 from 0: the weights are -grad.
    joint = _fit(tmp_path, TwoGroups(per_group=False))
    assert joint == pytest.approx([-3 / 13, -4 / 13, -12 / 13], rel=1e-5)
    per_group = TwoGroups(per_group=True)
    assert _fit(tmp_path, per_group) == pytest.approx([-0.6, -0.8, -1.0], rel=1e-5)
    stats = per_group.stats  # norms before clipping: the total, and each group's
    assert float(stats["train/grad_norm"]) == pytest.approx(13.0)
    assert float(stats["train/grad_norm/a"]) == pytest.approx(5.0)
    assert float(stats["train/grad_norm/b"]) == pytest.approx(12.0)


def test_per_group_norms_are_logged_only_with_the_flag(tmp_path):
    module = TwoGroups(per_group=False)
    _fit(tmp_path, module)
    assert not [k for k in module.stats if k.startswith("train/grad_norm/")]


def test_a_non_finite_gradient_still_skips_the_step(tmp_path):
    module = TwoGroups(per_group=True, scale=float("inf"))
    assert _fit(tmp_path, module) == [0.0, 0.0, 0.0]  # no step: the weights stay at 0
    assert float(module.stats["fault/skipped_steps"]) == 1.0


def test_refused_where_the_groups_cannot_be_clipped_apart():
    step = OptimizerStep(max_grad_norm=1.0, clip_grad_per_group=True)
    with pytest.raises(ValueError, match="DeepSpeed clips the global gradient norm") as err:
        step.configure(CPUDeepSpeedStrategy(stage=2))
    assert "Fix: set model.init_args.optim.clip_per_network: false" in str(err.value)
    step.configure(SingleDeviceStrategy("cpu"))  # a plain process: accepted
    OptimizerStep(max_grad_norm=1.0).configure(CPUDeepSpeedStrategy(stage=2))  # flag off


@pytest.mark.parametrize("per_group", [False, True])
def test_a_float16_loss_scaler_with_clipping_is_refused(per_group):
    # under manual optimisation Lightning's GradScaler unscales inside optimizer.step(), after
    # the clip: the clip (joint or per group) would act on loss-scaled gradients
    scaled = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object()))
    step = OptimizerStep(max_grad_norm=1.0, clip_grad_per_group=per_group)
    with pytest.raises(ValueError, match=r"16-mixed with max_grad_norm.*Fix: trainer.precision"):
        step.configure(scaled)
    OptimizerStep(max_grad_norm=None).configure(scaled)  # nothing clipped: accepted


def test_ppo_refuses_the_flag_under_deepspeed_before_any_load():
    module = PPOModule(
        reward=ConstantReward(0.0), advantage={"estimator": "gae"}, optim={"clip_per_network": True}
    )
    module._trainer = SimpleNamespace(strategy=CPUDeepSpeedStrategy(stage=2))
    with pytest.raises(ValueError, match="clip_per_network"):
        module.configure_model()
    assert module.policy is None


class VaryingReward:
    """A score that varies with the text (the critic starts at 0: a constant would give no
    advantage and no value loss)."""

    def __call__(self, prompts, completions, rows):
        return RewardOutput(torch.tensor([sum(map(ord, c)) % 7 / 7 for c in completions]))


class ClippedPolicyNorm(L.Callback):
    """The policy's gradient norm as the optimizer sees it (after clipping)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.policy.parameters() if p.grad is not None]
        self.norm = float(torch.nn.utils.get_total_norm(grads))


def _ppo_policy_norm(tiny_model_dir, tmp_path, *, per_network: bool, vf_coef: float):
    L.seed_everything(0)
    module = PPOModule(
        reward=VaryingReward(),
        model=tiny_model_dir,
        tokenizer=load_tokenizer(tiny_model_dir),
        engine=HFGenerationEngine(max_new_tokens=6),
        advantage={"estimator": "gae"},
        rollout={"samples_per_prompt": 2},
        optim={"micro_batch_size": 4, "max_grad_norm": 1e-3, "clip_per_network": per_network},
        critic={"vf_coef": vf_coef},
    )
    probe = ClippedPolicyNorm()
    trainer = quiet_trainer(tmp_path, limit_train_batches=1, callbacks=[probe], logger=True)
    trainer.fit(module, prompt_loader(module.tokenizer, ["1 2 3", "4 5"], 2))
    return probe.norm, trainer.logged_metrics


def test_ppo_per_network_clip_keeps_the_policy_free_of_the_critic_scale(tiny_model_dir, tmp_path):
    """Under the flag, the policy's clipped gradient is the same whether the critic's gradient is
    scaled by 1 or 1,000 (vf_coef); under the joint clip a large critic gradient shrinks it."""
    norm_1, logged = _ppo_policy_norm(tiny_model_dir, tmp_path, per_network=True, vf_coef=1.0)
    norm_1000, _ = _ppo_policy_norm(tiny_model_dir, tmp_path, per_network=True, vf_coef=1e3)
    assert norm_1 == pytest.approx(1e-3, rel=1e-3)  # clipped to max_grad_norm on its own
    assert norm_1000 == pytest.approx(norm_1, rel=1e-4)
    assert {"ppo/grad_norm/policy", "ppo/grad_norm/critic"} <= logged.keys()
    assert float(logged["ppo/grad_norm/policy"]) > 1e-3  # the clip acted
    joint, _ = _ppo_policy_norm(tiny_model_dir, tmp_path, per_network=False, vf_coef=1e3)
    assert joint < 0.5 * norm_1  # the critic's share of the joint norm shrank the policy's step
