"""scripts/compare_grm.py without training: the fragments of ``--dry-run`` and the results table
built from hand-made metrics.csv files; scripts/eval_judge.py on a tiny judge."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from tests.distributed.launch import run_python
from tests.helpers import load_script


def test_dry_run_writes_one_fragment_per_arm(tmp_path: Path, capsys) -> None:
    script = load_script("compare_grm")
    script.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "--steps", "5"])
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == sorted(
        f"{arm}-seed{s}.yaml" for arm in ("base", "rft", "consistrm") for s in (0, 1)
    )
    printed = capsys.readouterr().out
    assert printed.count("lit_rlhf.cli validate") == 2 and printed.count("lit_rlhf.cli fit") == 4
    consistrm = yaml.safe_load((tmp_path / "consistrm-seed1.yaml").read_text())
    model = consistrm["model"]["init_args"]
    assert (model["seed"], model["mode"]) == (1, "consistrm")
    # the base config's VerdictReward, label-free: same scores and format, mode "format"
    assert model["reward"]["init_args"]["mode"] == "format"
    assert model["reward"]["init_args"]["invalid"] == -1.0
    assert consistrm["trainer"]["limit_train_batches"] == 5
    answer = consistrm["trainer"]["callbacks"][-1]
    assert answer["class_path"] == "lit_rlhf.callbacks.ConsistencyAnswerReward"
    assert answer["init_args"] == {
        "tags": ["Result"],
        "prefix": " <Result>Response 1 is",
        "suffix": " than Response 2</Result>",
    }
    rft = yaml.safe_load((tmp_path / "rft-seed0.yaml").read_text())
    assert rft["model"]["init_args"]["mode"] == "rft"
    assert all("Consistency" not in c["class_path"] for c in rft["trainer"]["callbacks"])


def test_summary_is_the_last_validation_mean_and_spread(tmp_path: Path) -> None:
    script = load_script("compare_grm")
    paths = []
    for seed, acc in ((0, 0.5), (1, 0.7)):
        path = tmp_path / f"seed{seed}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["step", *script.METRICS])
            writer.writeheader()
            writer.writerow(
                {
                    "step": 0,
                    "val/accuracy": 0.1,
                    "val/positional_consistency": 0.0,
                    "val/format_valid": 1.0,
                }
            )
            writer.writerow(
                {
                    "step": 9,
                    "val/accuracy": acc,
                    "val/positional_consistency": 0.5,
                    "val/format_valid": 1.0,
                }
            )
        paths.append(path)
    table = script.summarise({"rft": paths})
    # last validation of each seed: mean (0.5 + 0.7) / 2 = 0.6, sample std 0.141
    assert "| rft | 0.600 ± 0.141 | 0.500 ± 0.000 | 1.000 ± 0.000 |" in table


def test_eval_judge_prints_the_metrics_table(tmp_path: Path) -> None:
    out = run_python(
        "scripts/eval_judge.py",
        "--model",
        "builtin:tiny-llama",
        "--synthetic",
        "4",
        "--template",
        "consistrm-v1-short",
        "--max-new-tokens",
        "8",
        "--samples",
        "2",
        "--inference",
        "reflective",
        "--json",
        str(tmp_path / "m.json"),
    )
    for name in ("accuracy", "positional_consistency", "format_valid", "tie_rate"):
        assert f"| {name} |" in out
    assert (tmp_path / "m.json").exists()


def test_reflectrm_study_builds_records_then_trains_unified_and_reflects(
    tmp_path: Path, capsys
) -> None:
    script = load_script("compare_grm")
    script.main(["--study", "reflectrm", "--dry-run", "--out", str(tmp_path), "--seeds", "0"])
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.strip()]
    assert lines[0].startswith("records: ") and "build_reflectrm_data.py" in lines[0]
    assert "--samples 8" in lines[0] and str(tmp_path / "reflectrm-records.jsonl") in lines[0]
    arms = [line.split(" seed ")[0] for line in lines[1:]]
    assert arms == ["base", "base-reflective", "rft", "unified", "reflectrm"]
    assert "validate" in lines[-1] and "--ckpt_path" in lines[-1]
    unified = yaml.safe_load((tmp_path / "unified-seed0.yaml").read_text())
    model, data = unified["model"]["init_args"], unified["data"]["init_args"]
    assert model["mode"] == "reflectrm"
    assert (model["inference"], model["eval_samples"]) == ("single", 1)  # one greedy judgment
    assert model["response_prefix"] == data["response_prefix"] == " <Result>{subject} 1 is"
    assert model["reward"]["init_args"]["suffix"] == " than {subject} 2</Result>"
    assert data["train"]["init_args"]["path"] == str(tmp_path / "reflectrm-records.jsonl")
    assert unified["trainer"]["max_steps"] == 60
    full = yaml.safe_load((tmp_path / "reflectrm-seed0.yaml").read_text())["model"]["init_args"]
    assert (full["mode"], full["inference"], full["eval_samples"]) == ("reflectrm", "reflective", 8)
    base = yaml.safe_load((tmp_path / "base-reflective-seed0.yaml").read_text())
    assert base["model"]["init_args"]["inference"] == "reflective"
    assert "response_prefix" not in base["model"]["init_args"]  # the base config's format


def _composed(configs: list[Path]) -> dict:
    import contextlib
    import io

    import pytest

    from lit_rlhf.cli import cli_main

    out = io.StringIO()
    args = ["fit", *[a for c in configs for a in ("--config", str(c))], "--print_config"]
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(args)
    return yaml.safe_load(
        "\n".join(x for x in out.getvalue().splitlines() if not x.startswith("["))
    )


def test_gpu_consistrm_arm_is_the_consistrm_preset_with_a_seeded_memory(tmp_path, capsys):
    script = load_script("compare_grm")
    script.main(["--preset", "gpu", "--dry-run", "--out", str(tmp_path), "--seeds", "0"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    # the memory is seeded first: 8 votes of the starting judge per training query
    assert lines[0].startswith("memory: ") and "seed_consistrm_memory.py" in lines[0]
    assert "--samples 8" in lines[0] and "--config configs/grm/rft_qwen3-8b.yaml" in lines[0]
    # every run composes the DeepSpeed fragment the preset's header names
    runs = [line for line in lines if " seed 0: " in line]
    assert len(runs) == 3
    assert all("--config configs/trainer/deepspeed_zero3.yaml" in line for line in runs)
    fragment = tmp_path / "consistrm-seed0.yaml"
    callbacks = yaml.safe_load(fragment.read_text())["trainer"]["callbacks"]
    answer, critique = callbacks[-2]["init_args"], callbacks[-1]["init_args"]
    assert answer["initial_memory"] == str(tmp_path / "consistrm-memory.jsonl")
    # the authors' critique embedder: Qwen3-Embedding-4B, last token, L2-normalised, 1024 tokens
    assert critique == {"embedder": "Qwen/Qwen3-Embedding-4B", "pooling": "last",
                        "normalize": True, "max_length": 1024, "dtype": "float16",
                        "text": "response", "bonus": 0.1}  # fmt: skip
    # composed, the arm is configs/grm/consistrm_qwen3-8b.yaml (but for logging and seeds)
    trainer = Path("configs/trainer/deepspeed_zero3.yaml")
    arm = _composed([Path("configs/grm/rft_qwen3-8b.yaml"), trainer, fragment])
    preset = _composed([Path("configs/grm/consistrm_qwen3-8b.yaml"), trainer])
    for key in ("seed", "eval_samples", "inference"):
        arm["model"]["init_args"].pop(key), preset["model"]["init_args"].pop(key)
    assert arm["model"] == preset["model"]
    arm["data"]["init_args"].pop("seed"), preset["data"]["init_args"].pop("seed")
    assert arm["data"] == preset["data"]
    assert arm["trainer"]["callbacks"][-1] == preset["trainer"]["callbacks"][-1]


def test_gpu_reflectrm_study_is_qwen3_4b_with_the_no_think_switch(tmp_path, capsys):
    script = load_script("compare_grm")
    argv = ["--preset", "gpu", "--study", "reflectrm", "--dry-run", "--out", str(tmp_path)]
    script.main([*argv, "--seeds", "0"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("records: ") and "--model Qwen/Qwen3-4B" in lines[0]
    assert "--question-suffix  /no_think" in lines[0]  # the argument is " /no_think"
    runs = [line for line in lines if " seed 0: " in line]
    assert all("--config configs/grm/reflectrm_qwen3-4b.yaml" in line for line in runs)
    rft = yaml.safe_load((tmp_path / "rft-seed0.yaml").read_text())
    train = rft["data"]["init_args"]["train"]
    assert train["init_args"] == {"path": "nvidia/HelpSteer3", "schema": "helpsteer3",
                                  "split": "train", "id_field": None,
                                  "template": "reflectrm-v1"}  # fmt: skip
    assert rft["model"]["init_args"]["mode"] == "rft"


def test_build_reflectrm_data_writes_records_and_their_statistics(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    printed = run_python(
        "scripts/build_reflectrm_data.py", "--model", "builtin:tiny-llama", "--synthetic", "4",
        "--template", "consistrm-v1-short", "--samples", "2", "--max-new-tokens", "4",
        "--out", str(out),
    )  # fmt: skip
    stats = json.loads(printed[printed.index("{") : printed.rindex("}") + 1])
    assert stats["items"] == 4 and stats["all_correct"] == 0  # a random judge is never right
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == stats["preference"] == 4 and stats["reflection"] == 0
    assert "no reflection record" in printed  # and it says why


def test_compare_multidomain_fragments_for_the_four_arms(tmp_path: Path, capsys) -> None:
    script = load_script("compare_multidomain")
    script.main(["--dry-run", "--out", str(tmp_path), "--seeds", "3"])
    assert capsys.readouterr().out.count("lit_rlhf.cli fit") == 4
    arms = {a: yaml.safe_load((tmp_path / f"{a}-seed3.yaml").read_text()) for a in script.ARMS}
    surgery = {a: [c for c in f["trainer"]["callbacks"] if "GradientSurgery" in c["class_path"]]
               for a, f in arms.items()}  # fmt: skip
    assert surgery["mixed"] == [] and surgery["sequential"] == []
    assert surgery["pcgrad"][0]["init_args"] == {"granularity": "global", "seed": 3}
    assert surgery["mgs"][0]["init_args"] == {"granularity": "module", "seed": 3}
    data = arms["sequential"]["data"]["init_args"]
    assert data["shuffle"] is False and data["train"]["init_args"]["schedule"] == "sequential"
    assert arms["mgs"]["trainer"]["limit_train_batches"] == 12
