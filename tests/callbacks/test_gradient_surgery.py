"""ModularGradientSurgery on one process: the step uses exactly the surgery of the per-task
gradients (computed here by hand), global granularity is PCGrad, a module without task labels
is refused, and without the callback the step is the plain mixed gradient."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.algos.gradient_surgery import group_parameters, surgery
from lit_rlhf.callbacks import ModularGradientSurgery
from tests.mgs_fixtures import TaskData, TaskModule, loader


def _fit(callbacks: list, module: TaskModule | None = None) -> TaskModule:  # type: ignore[type-arg]
    module = module or TaskModule()
    trainer = L.Trainer(accelerator="cpu", max_steps=1, callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(module, loader(batch_size=8))
    return module


def _task_grads() -> dict[str, dict[str, torch.Tensor]]:
    module, data = TaskModule(), TaskData()
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for task in sorted(set(data.tasks)):
        module.zero_grad()
        rows = [i for i, t in enumerate(data.tasks) if t == task]
        (((module.net(data.x[rows]).squeeze(-1) - data.y[rows]) ** 2).sum() / 8).backward()
        grads[task] = {n: p.grad.clone() for n, p in module.named_parameters()}
    return grads


@pytest.mark.parametrize("granularity", ["tensor", "global"])
def test_the_step_is_the_surgery_of_the_per_task_gradients(granularity: str) -> None:
    start = {n: p.detach().clone() for n, p in TaskModule().named_parameters()}
    trained = _fit([ModularGradientSurgery(granularity=granularity, seed=5)])
    grads = _task_grads()
    groups = group_parameters(list(start), granularity)  # type: ignore[arg-type]
    expected, stats = surgery(grads, groups, generator=torch.Generator().manual_seed(5 * 1_000_003))
    assert sum(s.projections for s in stats.values()) > 0  # the tasks do conflict here
    for name, param in trained.named_parameters():
        torch.testing.assert_close(param.detach(), start[name] - 0.1 * expected[name])
    logged = trained.stats[0]
    assert float(logged["ModularGradientSurgery/domains"]) == 3.0
    assert 0 < float(logged["ModularGradientSurgery/conflict_fraction"]) <= 1


def test_without_the_callback_the_step_is_the_mixed_gradient() -> None:
    start = {n: p.detach().clone() for n, p in TaskModule().named_parameters()}
    trained = _fit([])
    grads = _task_grads()
    for name, param in trained.named_parameters():
        mixed = sum(g[name] for g in grads.values())
        torch.testing.assert_close(param.detach(), start[name] - 0.1 * mixed)


def test_a_module_without_task_labels_is_refused() -> None:
    class Unlabelled(TaskModule):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y, _ = batch
            self.step_fn(self, self.optimizers(), [(x, y)],
                         lambda m: ((self.net(m[0]).squeeze(-1) - m[1]) ** 2).mean())  # fmt: skip

    with pytest.raises(ValueError, match="task_of"):
        _fit([ModularGradientSurgery()], Unlabelled())
    with pytest.raises(ValueError, match="granularity must be"):
        ModularGradientSurgery(granularity="block")  # type: ignore[arg-type]


def _fit_steps(steps: int, root: str, ckpt_path: str | None = None) -> TaskModule:
    module = TaskModule()
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, default_root_dir=root,
                        callbacks=[ModularGradientSurgery(granularity="tensor", seed=3)],
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(module, loader(batch_size=8), ckpt_path=ckpt_path)
    if ckpt_path is None:
        trainer.save_checkpoint(f"{root}/step{steps}.ckpt")
    return module


def test_a_resumed_run_projects_in_the_same_orders_as_an_uninterrupted_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uninterrupted = _fit_steps(4, str(tmp_path / "a"))
    _fit_steps(2, str(tmp_path / "b"))
    resumed = _fit_steps(4, str(tmp_path / "b"), ckpt_path=str(tmp_path / "b" / "step2.ckpt"))
    for (name, a), b in zip(uninterrupted.named_parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    # the orders do depend on the step: a resume that restarted the order generator would differ
    grads, groups = (
        _task_grads(),
        group_parameters([n for n, _ in TaskModule().named_parameters()], "tensor"),
    )
    step = [surgery(grads, groups, generator=torch.Generator().manual_seed(3 * 1_000_003 + s))[0]
            for s in range(4)]  # fmt: skip
    assert any(not torch.equal(step[0][n], step[s][n]) for s in range(1, 4) for n in grads["chat"])


def test_an_unknown_parameter_is_refused_when_fit_starts_before_any_step() -> None:
    class WithRouter(TaskModule):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                [torch.nn.ModuleDict({"router": torch.nn.Linear(2, 2)})]
            )

    module = WithRouter()
    with pytest.raises(ValueError, match=r"'blocks\.0\.router\.weight'.*Fix: granularity: tensor"):
        _fit([ModularGradientSurgery(granularity="module")], module)
    assert module.trainer.global_step == 0
    mapped = ModularGradientSurgery(granularity="module", module_map={"router": "mlp"})
    _fit([mapped], WithRouter())  # the same model trains once the submodule's kind is given
    assert mapped._groups is not None and "blocks.0.mlp" in mapped._groups


def test_measuring_only_steps_with_the_mixed_gradient_and_logs_both_granularities() -> None:
    from lit_rlhf.algos.gradient_surgery import conflict_summary, task_gram

    start = {n: p.detach().clone() for n, p in TaskModule().named_parameters()}
    callback = ModularGradientSurgery(granularity="module", seed=2, apply=False,
                                      diagnostics=["module", "global"])  # fmt: skip
    trained = _fit([callback])
    grads = _task_grads()
    for name, param in trained.named_parameters():
        mixed = sum(g[name] for g in grads.values())
        torch.testing.assert_close(param.detach(), start[name] - 0.1 * mixed)
    logged = trained.stats[0]
    assert float(logged["ModularGradientSurgery/removed_share"]) == pytest.approx(0.0, abs=1e-6)
    assert float(logged["ModularGradientSurgery/norm_ratio"]) == pytest.approx(1.0, abs=1e-6)
    _, grams = task_gram(grads)
    for granularity in ("module", "global"):
        groups = group_parameters(list(start), granularity)  # type: ignore[arg-type]
        expected = conflict_summary(grams, groups)
        key = f"ModularGradientSurgery/{granularity}/"
        assert float(logged[key + "conflict_fraction"]) == pytest.approx(expected.conflict_fraction)
        assert float(logged[key + "cosine_mean"]) == pytest.approx(expected.cosine_mean, abs=1e-5)
        assert float(logged[key + "removed_share"]) >= 0


def test_the_applied_surgery_logs_the_share_of_the_norm_it_removes() -> None:
    trained = _fit([ModularGradientSurgery(granularity="global", seed=5)])
    grads = _task_grads()
    names = list(grads["chat"])
    groups = group_parameters(names, "global")
    combined, _ = surgery(grads, groups, generator=torch.Generator().manual_seed(5 * 1_000_003))
    plain = torch.cat([sum(g[n] for g in grads.values()).reshape(-1) for n in names])
    after = torch.cat([combined[n].reshape(-1) for n in names])
    logged = trained.stats[0]
    share = float((plain - after).norm() / plain.norm())
    assert share > 0.01  # the tasks conflict, so PCGrad changes the step
    assert float(logged["ModularGradientSurgery/removed_share"]) == pytest.approx(share, rel=1e-4)
    ratio = float(after.norm() / plain.norm())
    assert float(logged["ModularGradientSurgery/norm_ratio"]) == pytest.approx(ratio, rel=1e-4)


def test_the_null_control_relabels_prompt_groups_and_the_core_asks_for_it() -> None:
    from lit_rlhf.training.protocols import gradient_task_labels

    class _Trainer:
        global_step = 4

    tasks, groups = ["a", "a", "b", "b", "c", "c"], [0, 0, 1, 1, 2, 2]
    plain = ModularGradientSurgery(seed=1)
    null = ModularGradientSurgery(seed=1, shuffle_tasks=True)
    assert gradient_task_labels(plain, _Trainer(), tasks, groups) == tasks
    assert gradient_task_labels(object(), _Trainer(), tasks, groups) == tasks  # no hook method
    seen = {tuple(gradient_task_labels(ModularGradientSurgery(seed=s, shuffle_tasks=True),
                                       _Trainer(), tasks, groups)) for s in range(12)}  # fmt: skip
    assert len(seen) > 1 and all(sorted(s) == sorted(tasks) for s in seen)
    again = gradient_task_labels(null, _Trainer(), tasks, groups)
    assert again == gradient_task_labels(null, _Trainer(), tasks, groups)  # seeded by step
    with pytest.raises(ValueError, match="granularity must be one of"):
        ModularGradientSurgery(diagnostics=["blocks"])  # type: ignore[list-item]


def test_a_module_with_automatic_optimisation_is_refused_at_setup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    class Automatic(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            return self.weight.square()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, default_root_dir=tmp_path,
        callbacks=[ModularGradientSurgery()],
    )  # fmt: skip
    data = torch.utils.data.DataLoader(torch.zeros(2, 1), batch_size=1)
    with pytest.raises(ValueError, match=r"automatic optimisation.*would do nothing"):
        trainer.fit(Automatic(), data)
