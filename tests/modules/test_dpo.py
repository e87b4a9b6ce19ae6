"""DPOModule: pairs encoded as SFT rows and scored by hand, a tiny model that raises its reward
accuracy and margin on the shared pair DataModule while the reference stays frozen (and out of
checkpoints), SimPO and LoRA without a second model, micro-batch accumulation equal to one
pass, the CLI's loss switch, and settings (and ties) refused before any model loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

import lit_rlhf.training.networks as networks
from lit_rlhf.cli import cli_main
from lit_rlhf.data import PreferencePairs, PromptDataModule
from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import DPOModule
from lit_rlhf.modules.dpo import PAIR_STATS
from tests.helpers import quiet_trainer

REPO = Path(__file__).parents[2]
TINY = "builtin:tiny-llama"
ROWS = [
    {"query": "Say yes.", "response_1": "no", "response_2": "yes", "label": 1, "query_id": "a"},
    {"query": "Answer.", "response_1": "yes please", "response_2": "no", "label": -1,
     "query_id": "b"},
    {"query": "Reply now.", "response_1": "nope", "response_2": "yes", "label": 1,
     "query_id": "c"},
    {"query": "Well?", "response_1": "yes indeed", "response_2": "no way", "label": -1,
     "query_id": "d"},
]  # fmt: skip


def _module(**kwargs: Any) -> DPOModule:
    optim = {"lr": 1e-3, **kwargs.pop("optim", {})}
    module = DPOModule(model=TINY, tokenizer=load_tokenizer(TINY), optim=optim, **kwargs)
    module.configure_model()
    return module


def _stats(module: DPOModule, rows: list[dict[str, Any]]) -> dict[str, float]:
    with torch.no_grad():
        _, stats = module.pair_losses(rows)
    return {name: float(value.mean()) for name, value in stats.items()}


def test_pairs_are_scored_as_the_sum_of_their_response_token_log_probs() -> None:
    module = _module()
    module.model.eval()
    tokenizer = module.tokenizer
    batch = module.encode_pairs(ROWS[:2])  # chosen first: row a's response_2, row b's response_1
    by_hand, lengths = [], []
    with torch.no_grad():
        _, stats = module.pair_losses(ROWS[:2])
        for query, response in [("Say yes.", "yes"), ("Answer.", "yes please"),
                                ("Say yes.", "no"), ("Answer.", "no")]:  # fmt: skip
            prompt = tokenizer(render_chat_prompt(tokenizer, query), add_special_tokens=False)
            answer = [*tokenizer(response, add_special_tokens=False)["input_ids"],
                      tokenizer.eos_token_id]  # fmt: skip
            ids = torch.tensor([prompt["input_ids"] + answer])  # alone: no padding
            log_probs = torch.log_softmax(module.model(ids).logits[0].float(), -1)
            start = len(prompt["input_ids"])  # the first response token's position
            by_hand.append(
                sum(float(log_probs[t - 1, ids[0, t]]) for t in range(start, ids.shape[1]))
            )
            lengths.append(len(answer))
    assert (batch["labels"] != -100).sum(1).tolist() == lengths  # response tokens and EOS
    torch.testing.assert_close(
        stats["logps_chosen"], torch.tensor(by_hand[:2]), rtol=1e-5, atol=1e-4
    )
    torch.testing.assert_close(
        stats["logps_rejected"], torch.tensor(by_hand[2:]), rtol=1e-5, atol=1e-4
    )
    # before any step the policy is the reference: every implicit reward is 0, the loss log 2
    assert stats["reward_margin"].abs().max() == 0 and not stats["reward_accuracy"].any()
    torch.testing.assert_close(stats["loss"], torch.full((2,), 0.6931471805599453))


def _pairs_file(path: Path, n: int, offset: int) -> str:
    # the chosen response always says "yes", the rejected "no": learnable by a tiny model
    rows = [{"prompt": f"question {i}", "chosen": "yes", "rejected": "no", "id": offset + i}
            for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _data(tmp_path: Path, n: int = 32, validate_on_train: bool = False) -> PromptDataModule:
    train = PreferencePairs(_pairs_file(tmp_path / "train.jsonl", n, 0), schema="rewardbench")
    val = train if validate_on_train else None
    return PromptDataModule(TINY, train=train, val=val, batch_size=8, shuffle=False)


def _train_rows(data: PromptDataModule) -> list[dict[str, Any]]:
    data.setup("fit")
    return [row for batch in data.train_dataloader() for row in batch["row"]]


def test_a_few_steps_raise_reward_accuracy_and_margin_and_the_reference_stays_frozen(
    tmp_path: Path,
) -> None:
    data = _data(tmp_path)
    rows = _train_rows(data)
    assert {row["label"] for row in rows} == {-1, 1}  # both placements of the chosen response
    module = _module(optim={"micro_batch_size": 4}, export_dir=str(tmp_path / "hf"))
    reference = {k: v.clone() for k, v in module.ref_model.state_dict().items()}
    start = {k: v.clone() for k, v in module.model.state_dict().items()}
    before = _stats(module, rows)
    quiet_trainer(tmp_path, max_epochs=2, log_every_n_steps=1).fit(module, datamodule=data)
    after = _stats(module, rows)
    assert module.trainer.global_step == 8
    assert before["reward_accuracy"] == 0 and after["reward_accuracy"] == 1.0, after
    assert after["reward_margin"] > before["reward_margin"] + 0.5, (before, after)
    assert after["loss"] < before["loss"] - 0.2  # log 2 = 0.69 at the start
    # the reference: untouched, frozen, eval mode; every trained tensor moved
    assert all(torch.equal(v, reference[k]) for k, v in module.ref_model.state_dict().items())
    assert not any(p.requires_grad for p in module.ref_model.parameters())
    assert not module.ref_model.training
    moved = [k for k, v in module.model.state_dict().items() if not torch.equal(v, start[k])]
    assert len(moved) == len(start)
    logged = module.trainer.callback_metrics
    assert {f"train/{k}" for k in (*PAIR_STATS, "lr", "grad_norm")} <= set(logged)
    # the export loads in transformers with the policy's logits
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = module.encode_pairs(rows[:1])["input_ids"]  # the chosen and the rejected sequence
    module.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, module.model(ids).logits, rtol=0, atol=0)


def test_validation_logs_the_pair_metrics_and_checkpoints_leave_the_reference_out(
    tmp_path: Path,
) -> None:
    data = _data(tmp_path, n=8, validate_on_train=True)
    module = _module(optim={"micro_batch_size": 3})
    trainer = quiet_trainer(tmp_path, max_steps=1, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
    expected = _stats(module, _train_rows(data))
    for name, value in expected.items():
        assert metrics[f"val/{name}"] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    path = tmp_path / "one.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert saved and not [k for k in saved if k.startswith("ref_model.")]
    again = DPOModule.load_from_checkpoint(path, tokenizer=module.tokenizer)  # strict loading
    assert torch.equal(again.model.lm_head.weight, module.model.lm_head.weight)


def _counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    loads: list[str] = []
    load = networks.load_causal_lm

    def counted(name: str, **kwargs: Any) -> Any:
        loads.append(name)
        return load(name, **kwargs)

    monkeypatch.setattr(networks, "load_causal_lm", counted)
    return loads


def test_simpo_loads_no_reference_and_learns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loads = _counting_loads(monkeypatch)
    module = _module(loss={"kind": "simpo", "beta": 2.0, "simpo_gamma": 0.5})
    assert loads == [TINY] and module.ref_model is None
    before = _stats(module, ROWS)
    _step(module, ROWS, tmp_path, steps=6)
    after = _stats(module, ROWS)
    assert after["reward_margin"] > before["reward_margin"] and after["loss"] < before["loss"]
    loads.clear()
    _module()  # sigmoid DPO: the policy and its reference
    assert loads == [TINY, TINY]


def test_lora_uses_the_base_with_adapters_off_as_the_reference(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("peft")
    loads = _counting_loads(monkeypatch)
    module = _module(
        lora={"rank": 4, "alpha": 8}, optim={"lr": 1e-2}, export_dir=str(tmp_path / "hf")
    )
    assert loads == [TINY] and module.ref_model is None
    base = {k: v.clone() for k, v in module.model.state_dict().items() if "lora_" not in k}
    before = _stats(module, ROWS)
    assert before["reward_margin"] == 0  # LoRA's B starts at 0: the policy is the base
    batch = module.encode_pairs(ROWS)
    reference = module.reference_log_probs(batch)
    _step(module, ROWS, tmp_path, steps=4)
    after = _stats(module, ROWS)
    assert after["reward_margin"] > before["reward_margin"]
    assert all(torch.equal(v, module.model.state_dict()[k]) for k, v in base.items())
    # the reference is the untouched base: its log-probs did not move with the adapters
    again = module.reference_log_probs(batch)
    assert reference is not None and again is not None
    for first, second in zip(reference, again, strict=True):
        torch.testing.assert_close(first, second)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    module.model.eval()
    with torch.no_grad():  # the export: adapters merged into the base; the module keeps them
        merged = loaded(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        policy = module.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        with module.model.disable_adapter():
            base_logits = module.model(batch["input_ids"], attention_mask=batch["attention_mask"])
    torch.testing.assert_close(merged, policy, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(base_logits.logits, policy)


def test_a_lora_checkpoint_holds_the_adapters_only(tmp_path: Path) -> None:
    """Under LoRA the base is rebuilt from ``model`` on every start: the checkpoint keeps the
    adapters, and strict loading puts the base back."""
    pytest.importorskip("peft")
    module = _module(lora={"rank": 4, "alpha": 8}, optim={"lr": 1e-2})
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(module, train_dataloaders=DataLoader([{"row": ROWS}] * 2, batch_size=None))
    path = tmp_path / "lora.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert saved and all(".lora_" in k for k in saved), sorted(saved)[:5]
    again = DPOModule.load_from_checkpoint(path, tokenizer=module.tokenizer)  # strict loading
    for name, value in module.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[name], value), name


def _step(
    module: DPOModule, rows: list[dict[str, Any]], root: Path, steps: int, **kwargs: Any
) -> None:
    """``steps`` optimizer steps on one batch of ``rows`` (a plain loader, no DataModule)."""
    loader = DataLoader([{"row": rows}] * steps, batch_size=None)
    quiet_trainer(root, max_steps=steps, **kwargs).fit(module, train_dataloaders=loader)


class GradientRecorder(Callback):
    """A gradient hook (``lit_rlhf.training.protocols``): the reduced gradients before the step."""

    def __init__(self) -> None:
        super().__init__()
        self.grads: dict[str, torch.Tensor] = {}

    def on_gradients(self, trainer: Any, pl_module: Any, grads: Any) -> None:
        self.grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters()
                      if p.grad is not None}  # fmt: skip


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
def test_micro_batches_accumulate_to_one_pass(loss: str, tmp_path: Path) -> None:
    grads = []
    for size in (4, 1, 3):  # one pass; four of one pair; 3 + 1
        torch.manual_seed(0)
        module = _module(loss={"kind": loss, "label_smoothing": 0.1 if loss == "sigmoid" else 0.0},
                         optim={"micro_batch_size": size, "max_grad_norm": None})  # fmt: skip
        module.model.eval()  # no dropout: the passes are comparable
        recorder = GradientRecorder()
        _step(module, ROWS, tmp_path, steps=1, callbacks=[recorder])
        grads.append(recorder.grads)
    assert grads[0] and set(grads[0]) == set(grads[1]) == set(grads[2])
    for other in grads[1:]:
        for name, grad in grads[0].items():
            torch.testing.assert_close(other[name], grad, rtol=1e-5, atol=1e-5)


def test_the_cli_switches_the_loss_by_a_flag(tmp_path: Path) -> None:
    args = ["--config", str(REPO / "configs" / "dpo" / "tiny.yaml"), "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    cli = cli_main([*args, "--model.init_args.loss.kind=ipo"], run=False)  # run=False: no fit
    assert isinstance(cli.model, DPOModule) and cli.model.loss.kind == "ipo"
    assert cli.model.hparams.loss == {"kind": "ipo", "beta": 0.1, "label_smoothing": 0.0,
                                      "simpo_gamma": 0.5}  # fmt: skip
    assert cli.model.tokenizer is cli.datamodule.tokenizer  # the CLI's link


def test_the_cli_refuses_an_unknown_loss_kind_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--config", str(REPO / "configs" / "dpo" / "tiny.yaml"), "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    with pytest.raises(SystemExit) as done:  # the Literal, at parse time
        cli_main([*args, "--model.init_args.loss.kind=kto"], run=False)
    assert done.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: model.init_args.loss.kind: Expected a typing.Literal['sigmoid'")
    assert "Got value: kto" in last


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": {"beta": -0.1}}, r"loss\.beta=-0.1 must be > 0 and finite"),
        ({"loss": {"beta": float("nan")}}, r"loss\.beta=nan must be > 0"),
        ({"loss": {"label_smoothing": 0.5}}, r"loss\.label_smoothing=0.5 must be in \[0, 0.5\)"),
        (
            {"loss": {"kind": "kto"}},
            r"loss\.kind='kto' is not one of \['sigmoid', 'ipo', 'simpo'\]",
        ),
        ({"loss": {"simpo_gamma": -1.0}}, r"loss\.simpo_gamma=-1.0 must be >= 0"),
        ({"loss": {"simpo_gamma": 1.0}}, r"loss\.simpo_gamma=1.0: loss\.kind='sigmoid' does not"),
        ({"optim": {"lr": -1e-6}}, r"optim\.lr=-1e-06 must be > 0"),
        ({"optim": {"micro_batch_size": 0}}, r"optim\.micro_batch_size=0 must be an integer >= 1"),
        (
            {"loss": {"kind": "ipo", "label_smoothing": 0.1}},
            r"cDPO's.*loss\.kind='ipo' would ignore it",
        ),
        (
            {"loss": {"kind": "simpo"}, "reference_model": TINY},
            r"reference-free.*\['reference_model'\]",
        ),
        (
            {"loss": {"kind": "simpo"}, "precision": {"reference_dtype": "bfloat16"}},
            r"reference-free.*\['precision\.reference_dtype'\]",
        ),
        (
            {"lora": {"rank": 4}, "precision": {"reference_dtype": "bfloat16"}},
            r"precision\.reference_dtype='bfloat16' with lora\.rank > 0.*would change nothing",
        ),
        ({"lora": {"rank": 4, "quantize": "4bit"}}, r"lora\.quantize='4bit': DPOModule does not"),
        ({"max_length": 1}, r"max_length=1 must be >= 2.*model\.init_args\.max_length"),
    ],
)
def test_bad_settings_are_refused_at_construction(
    kwargs: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = _counting_loads(monkeypatch)
    with pytest.raises(ValueError, match=message):
        DPOModule(model="no/such-model", **kwargs)
    assert loads == []


def test_a_flat_argument_names_its_group() -> None:
    with pytest.raises(TypeError, match=r"DPOModule\(beta=\.\.\.\).* now loss\.beta"):
        DPOModule(beta=0.5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"now lora\.rank.*lora: \{rank: \.\.\.\}"):
        DPOModule(lora_rank=4)  # type: ignore[call-arg]


def test_ties_and_unlabelled_rows_are_refused() -> None:
    module = _module()
    tie = {**ROWS[0], "label": 0, "query_id": "q7"}
    with pytest.raises(ValueError, match=r"row 1 \(query 'q7'\) has label=0; DPO.*keep_ties=False"):
        module.pair_losses([ROWS[1], tie])
