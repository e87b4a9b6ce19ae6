"""scripts/reproduce.py compression: the smoke preset end to end (tiny models: every arm and
seed, the mechanism figures, the outputs, the cache on a second call), the GPU preset's printed
settings (exactly configs/compressor/qwen2.5_*.yaml; it used to train a 7B compressor with CPU
settings, issue 21), and the module's pieces on hand-computed cases."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import reproduce  # noqa: E402
from repro import compression, compression_runs  # noqa: E402

REPO = Path(__file__).parents[2]
MECHANISM = ("overwritten", "kept", "drifted", "val_ae_loss", "no_memory_loss")
MECHANISM += ("effective_rank", "decoder_entropy", "memory_gain", "train_ae_loss")


def test_smoke_runs_every_arm_and_seed_then_reuses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reproduce.main(["compression", "--smoke", "--out", str(tmp_path)])
    out = tmp_path / "compression" / "smoke"
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"small", "mid", "large"}
    for arm, by_seed in results["runs"].items():
        assert set(by_seed) == {"0", "1"}, arm
        for figures in by_seed.values():
            for key in MECHANISM:
                assert math.isfinite(figures[key]), (arm, key)
            assert 0 <= figures["overwritten"] + figures["kept"] <= 1
            assert figures["size"] == compression._SMOKE["sizes"][arm]
            assert [s for s, _ in figures["curves"]["train_ae_loss"]] == [1.0, 2.0]
            assert figures["curves"]["overwritten vs size"] == [
                [figures["size"], figures["overwritten"]]
            ]
    precheck = results["precheck"]
    assert precheck["go"] is True and "prior margin" in precheck["reason"]
    for arm in ("small", "mid", "large"):
        assert math.isfinite(precheck[arm]["prior_margin"]) and precheck[arm]["step_seconds"] > 0
    # the training passages of each seed hold none of the evaluation passages
    passages = out / "passages"
    held_out = {json.loads(line)["text"] for line in (passages / "eval.jsonl").open()}
    for seed in (0, 1):
        train = {json.loads(line)["text"] for line in (passages / f"train_seed{seed}.jsonl").open()}
        assert train and not train & held_out
    assert results["summary"]["primary"]["metric"] == "overwritten"
    assert "large - small" in (out / "results.md").read_text()
    assert (out / "compression.png").read_bytes()[:4] == b"\x89PNG"

    def fail(*args: object) -> None:
        raise AssertionError("a cached run was run again")

    monkeypatch.setattr(compression.PAPER, "run_arm", fail)
    monkeypatch.setattr(compression.PAPER, "precheck", fail)
    again = reproduce.main(["compression", "--smoke", "--out", str(tmp_path)])
    assert again is not None and again["precheck"] == precheck


def test_gpu_preset_prints_the_qwen_presets_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert reproduce.main(["compression", "--preset", "gpu", "--print-settings"]) is None
    settings = json.loads(capsys.readouterr().out)
    assert settings["preset"] == "gpu" and settings["decoder"] == "Qwen/Qwen2.5-1.5B"
    assert settings["probes"] == 12
    runs = settings["runs"]
    names = [runs[arm]["model"]["compressor"] for arm in ("small", "mid", "large")]
    assert names == ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"]
    for arm, micro in zip(("small", "mid", "large"), (8, 8, 4), strict=True):
        run = runs[arm]
        model, train = run["model"], run["train_text"]
        # ICAE: LoRA r128 / alpha 32 / dropout 0.05 on q, v; 512 tokens into 128 slots; lr 1e-4
        lora, optim = model["lora"], model["optim"]
        assert (lora["rank"], lora["alpha"], lora["dropout"]) == (128, 32, 0.05)
        assert (model["context_tokens"], model["compression_rate"]) == (512, 4)
        assert (optim["lr"], optim["lr_warmup_steps"], optim["micro_batch_size"]) == (
            1e-4,
            300,
            micro,
        )
        assert run["trainer"] == {
            "accelerator": "gpu",
            "devices": 1,
            "precision": "bf16-mixed",
            "max_steps": 5000,
        }
        # ... and they are the preset files' own settings, every one of them
        config = yaml.safe_load((REPO / run["config"]).read_text())
        assert model == config["model"]["init_args"]
        assert train == config["data"]["init_args"]["train"]["init_args"]
        assert run["val_text"] == config["data"]["init_args"]["val"]["init_args"]
        assert (
            run["data"]["global_batch_size"]
            == config["data"]["init_args"]["global_batch_size"]
            == 256
        )


def test_cpu_preset_cuts_smollm2_and_resolves_the_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lit_rlhf.training.precision as precision

    settings = compression.PAPER.presets["cpu"].settings
    assert settings["sizes"] == {"small": 4, "mid": 10, "large": 30}
    assert settings["decoder"] == settings["compressor"] == "builtin:smollm2-135m-instruct"
    for native, expected in ((False, ("32-true", "float32")), (True, ("bf16-mixed", "bfloat16"))):
        chosen = "bf16-mixed" if native else "32-true"
        monkeypatch.setattr(precision, "resolve_precision", lambda p, a, c=chosen: c)
        run = compression_runs.cpu_run(settings, 10, tmp_path / "t.jsonl", tmp_path / "e.jsonl")
        assert (run["trainer"]["precision"], run["model"]["decoder_dtype"]) == expected
        assert run["model"]["precision"]["dtype"] == "float32"  # the trainable compressor
        assert run["model"]["compressor_layers"] == 10
        assert run["train_text"]["path"] == str(tmp_path / "t.jsonl")


def test_drifted_rate_is_the_mean_of_the_drift_kinds_present() -> None:
    metrics = {"val/probe/role/drifted": 0.5, "val/probe/negation/drifted": 0.25}
    metrics |= {"val/probe/order/drifted": 0.0, "val/probe/overwrite/overwritten": 1.0}
    assert compression_runs.drifted_rate(metrics) == pytest.approx(0.25)
    assert compression_runs.drifted_rate({"val/probe/order/drifted": 0.5}) == 0.5
    assert math.isnan(compression_runs.drifted_rate({}))


def test_binned_curve_and_tail_mean() -> None:
    losses = [4.0, 2.0, 3.0, 1.0, 5.0]
    assert compression_runs.binned(losses, 2) == [[2.0, 3.0], [4.0, 2.0], [5.0, 5.0]]
    assert compression_runs.mean_tail(losses, 2) == 3.0
    assert math.isnan(compression_runs.mean_tail([], 3))


def test_run_figures_flags_a_run_that_does_not_encode() -> None:
    result: dict[str, Any] = {
        "metrics": {"val/ae_loss": 3.0, "val/probe/overwrite/overwritten": 0.5},
        "no_memory_loss": 3.5,  # below it, yet no gain: a learnt template, not an encoding
        "losses": [4.0, 3.0],
        "train_seconds": 1.0,
    }
    figures = compression_runs.run_figures(result, 1)
    assert figures["encodes"] == 0.0 and figures["overwritten"] == 0.5
    assert figures["curves"]["train_ae_loss"] == [[1.0, 4.0], [2.0, 3.0]]
    result["metrics"]["val/memory_gain"] = 0.04
    assert compression_runs.run_figures(result, 1)["encodes"] == 0.0
    result["metrics"]["val/memory_gain"] = 0.06
    assert compression_runs.run_figures(result, 1)["encodes"] == 1.0


def test_fact_stem_is_the_counterfactual_sentence_before_its_value() -> None:
    item = {
        "context": "It rained. The strawberries in Mira's garden are white. Mira left.",
        "subject": "strawberries",
        "fact": "white",
        "prior": "red",
    }
    assert compression_runs.fact_stem(item) == "The strawberries in Mira's garden are"
    with pytest.raises(ValueError, match=r"no sentence ending in ' blue\.'"):
        compression_runs.fact_stem({**item, "fact": "blue"})


class _Tokenizer:
    """Whitespace words -> ids from a fixed table."""

    vocab: ClassVar[dict[str, int]] = {
        "The": 0,
        "sky": 1,
        "is": 2,
        "blue": 3,
        "green": 4,
        "light": 5,
    }

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [self.vocab[w] for w in text.split()]}


class _BigramLM(torch.nn.Module):
    """Logits that depend on the last token only: after "is", log-probs of "blue" and "green"
    are set by hand; "green light" is two tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        logp = torch.full((6, 6), math.log(1e-6))
        logp[2, 3], logp[2, 4] = math.log(0.6), math.log(0.4)  # after "is"
        logp[4, 5], logp[4, 0] = math.log(0.5), math.log(0.5)  # after "green"
        self.table = logp

    def forward(self, input_ids: torch.Tensor) -> Any:
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_prior_margin_is_the_log_probability_difference_of_the_two_values() -> None:
    model, tokenizer = _BigramLM(), _Tokenizer()
    assert compression_runs.value_logprob(model, tokenizer, "The sky is", "blue") == (
        pytest.approx(math.log(0.6), abs=1e-4)
    )
    item = {"context": "The sky is green.", "subject": "sky", "fact": "green", "prior": "blue"}
    # one value token each: log 0.6 - log 0.4
    rows = torch.log_softmax(model.table, -1)
    expected = float(rows[2, 3] - rows[2, 4])
    (margin,) = compression_runs.prior_margins(model, tokenizer, [item])
    assert margin == pytest.approx(expected, abs=1e-5) and margin == pytest.approx(
        math.log(1.5), abs=1e-4
    )
    # a two-token value sums its tokens: log p(green | is) + log p(light | green)
    two = compression_runs.value_logprob(model, tokenizer, "The sky is", "green light")
    assert two == pytest.approx(math.log(0.4 * 0.5), abs=1e-4)
    summary = compression_runs.prior_summary([1.0, -1.0, 3.0])
    assert summary == {"prior_margin": 1.0, "prior_preferred": pytest.approx(2 / 3)}


def test_training_passages_leave_out_the_evaluation_passages() -> None:
    held_out = [i["context"] for i in compression_runs.probe_items(4, 0)]
    first = compression_runs.train_passages(10, 1000, avoid=[])
    again = compression_runs.train_passages(10, 1000, avoid=first[:3])
    assert len(first) == 10 and not set(again) & set(first[:3])
    assert not set(compression_runs.train_passages(40, 1000, held_out)) & set(held_out)
