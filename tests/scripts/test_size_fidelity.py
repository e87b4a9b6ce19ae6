"""scripts/size_fidelity.py: ``--preset gpu`` resolves, prints and runs with the GPU presets'
settings (configs/compressor/qwen2.5_*.yaml, ICAE's recipe), not the CPU ones (issue 21: it used
to train a 7B compressor with the CPU settings); the CPU preset still runs end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning
import pytest
import yaml

import lit_rlhf.data
import lit_rlhf.modules
from tests.helpers import load_script

REPO = Path(__file__).parents[2]
QWEN = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"]


def _printed(out: str) -> tuple[str, dict[str, Any]]:
    """(the header line, the settings) that the script printed first."""
    header, _, rest = out.partition("\n")
    settings, end = json.JSONDecoder().raw_decode(rest)
    assert end > 0
    return header, settings


def test_gpu_preset_prints_the_gpu_settings(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("size_fidelity")
    returned = script.main(["--preset", "gpu", "--print-settings"])
    header, settings = _printed(capsys.readouterr().out)
    assert header == "size_fidelity settings (preset gpu):"
    assert settings == returned
    assert settings["decoder"] == "Qwen/Qwen2.5-1.5B" and settings["probes"] == 12
    assert [run["model"]["compressor"] for run in settings["runs"]] == QWEN
    for run, micro in zip(settings["runs"], (8, 8, 4), strict=True):
        model, data, train = run["model"], run["data"], run["train_text"]
        # ICAE: LoRA r128 / alpha 32 / dropout 0.05 on q, v; 512 tokens into 128 slots; lr 1e-4
        assert (model["lora_rank"], model["lora_alpha"], model["lora_dropout"]) == (128, 32, 0.05)
        assert model["lora_target_modules"] == ["q_proj", "v_proj"]
        assert (model["context_tokens"], model["compression_rate"]) == (512, 4)
        assert (model["lr"], model["lr_warmup_steps"], model["lr_schedule"]) == (
            1e-4,
            300,
            "linear",
        )
        assert (model["dtype"], model["decoder_dtype"]) == ("float32", "bfloat16")
        assert (model["max_grad_norm"], model["micro_batch_size"]) == (2.0, micro)
        assert (data["batch_size"], data["tokenizer"]) == (256, "Qwen/Qwen2.5-1.5B")
        assert (train["path"], train["context_tokens"]) == ("JeanKaddour/minipile", 512)
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


def test_cpu_preset_settings_differ_from_the_gpu_ones(tmp_path: Path) -> None:
    script = load_script("size_fidelity")
    cpu = script.resolve(script.parse(["--out", str(tmp_path)]))
    gpu = script.resolve(script.parse(["--preset", "gpu"]))
    assert len(cpu["runs"]) == 5 and len(gpu["runs"]) == 3
    for run in cpu["runs"]:
        model = run["model"]
        assert run["trainer"] == {
            "accelerator": "cpu",
            "devices": 1,
            "precision": "32-true",
            "max_steps": 400,
        }
        assert (model["num_memory_tokens"], model["lr"], model["lora_rank"]) == (8, 1e-2, 0)
        assert run["train_text"]["context_tokens"] == 16 and run["data"]["batch_size"] == 8
        assert run["train_text"]["path"].endswith("lit_rlhf/data/samples/text_sample.jsonl")
        assert Path(model["compressor"]).parent == tmp_path / "models"
    for key, cpu_value in [
        (("trainer", "max_steps"), 400),
        (("trainer", "accelerator"), "cpu"),
        (("trainer", "precision"), "32-true"),
        (("model", "lr"), 1e-2),
        (("model", "lora_rank"), 0),
        (("train_text", "context_tokens"), 16),
        (("data", "batch_size"), 8),
    ]:
        assert all(run[key[0]][key[1]] == cpu_value for run in cpu["runs"])
        assert all(run[key[0]][key[1]] != cpu_value for run in gpu["runs"]), key


def test_explicit_flags_override_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("size_fidelity")
    args = ["--preset", "gpu", "--steps", "10", "--lr", "3e-4", "--memory-tokens", "64"]
    args += ["--compressors", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-3B", "--print-settings"]
    settings = script.main(args)
    runs = settings["runs"]
    assert [r["model"]["compressor"] for r in runs] == ["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-3B"]
    assert runs[0]["config"] == "configs/compressor/qwen2.5_7b.yaml"
    assert runs[1]["config"].startswith("configs/compressor/qwen2.5_0.5b.yaml (settings)")
    for run in runs:
        assert run["trainer"]["max_steps"] == 10 and run["model"]["lr"] == 3e-4
        assert (run["model"]["num_memory_tokens"], run["model"]["compression_rate"]) == (64, None)
        assert run["model"]["lora_rank"] == 128  # not given: the preset's
    with pytest.raises(SystemExit, match="--compressors is for --preset gpu"):
        script.main(["--compressors", "a", "--print-settings"])


BUILT: list[tuple[str, dict[str, Any]]] = []


class _Recorder:
    """Stands in for a class: records the keyword arguments it was built with in BUILT."""

    def __init__(self, **kwargs: Any) -> None:
        BUILT.append((type(self).__name__, kwargs))
        self.tokenizer = "<tokenizer>"


def test_gpu_runs_are_built_with_the_printed_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The sweep hands each preset run to ``run_one`` as printed, and ``build`` passes every
    setting of a run to the module, the data, and both trainers (no model is loaded)."""
    script = load_script("size_fidelity")
    calls: list[tuple[dict[str, Any], int, int]] = []

    def fake_run(run: dict[str, Any], seed: int, probes: int) -> dict[str, Any]:
        calls.append((run, seed, probes))
        return {"metrics": {"val/rougeL": 0.5}, "params": 1e6, "seconds": 1.0, "curve": [1.0]}

    monkeypatch.setattr(script, "run_one", fake_run)
    settings = script.main(["--preset", "gpu", "--seeds", "3", "--out", str(tmp_path)])
    _, printed = _printed(capsys.readouterr().out)
    assert [c[0] for c in calls] == printed["runs"] == settings["runs"]
    assert {(c[1], c[2]) for c in calls} == {(3, 12)}
    assert json.loads((tmp_path / "settings.json").read_text()) == printed
    assert "| Qwen2.5-7B | 1.00M |" in (tmp_path / "results.md").read_text()

    recorders = {n: type(n, (_Recorder,), {}) for n in ("Module", "Data", "Chunks", "Trainer")}
    monkeypatch.setattr(lit_rlhf.modules, "CompressorDecoderModule", recorders["Module"])
    monkeypatch.setattr(lit_rlhf.data, "PromptDataModule", recorders["Data"])
    monkeypatch.setattr(lit_rlhf.data, "TextChunks", recorders["Chunks"])
    monkeypatch.setattr(lightning, "Trainer", recorders["Trainer"])
    BUILT.clear()
    run = printed["runs"][2]  # the 7B
    script.build(run, 3, 12)
    by_class: dict[str, list[dict[str, Any]]] = {}
    for name, kwargs in BUILT:
        by_class.setdefault(name, []).append(kwargs)
    assert by_class["Chunks"] == [run["train_text"], run["val_text"]]
    assert by_class["Module"] == [{**run["model"], "tokenizer": "<tokenizer>"}]
    (data,) = by_class["Data"]
    assert {k: data[k] for k in run["data"]} == run["data"] and data["seed"] == 3
    fit, validate = by_class["Trainer"]
    assert {k: fit[k] for k in run["trainer"]} == run["trainer"]
    assert validate["precision"] == "bf16-mixed" and validate["accelerator"] == "gpu"


def test_cpu_preset_runs_end_to_end(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One CPU size, 2 pretraining and 2 training steps: the table, runs and plot are written."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    script = load_script("size_fidelity")
    monkeypatch.setattr(script, "CPU_SIZES", [(32, 1, 2)])
    args = ["--steps", "2", "--pretrain-steps", "2", "--seeds", "0", "--val-chunks", "4"]
    script.main([*args, "--probes", "1", "--out", str(tmp_path)])
    header, printed = _printed(capsys.readouterr().out)
    assert header == "size_fidelity settings (preset cpu):"
    assert printed["runs"][0]["trainer"]["max_steps"] == 2
    assert "| compressor-h32-l1 | 0.03M |" in (tmp_path / "results.md").read_text()
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert len(runs["compressor-h32-l1"][0]["curve"]) == 2  # one AE loss per training step
    assert (tmp_path / "size_fidelity.png").stat().st_size > 0
