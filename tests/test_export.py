"""``lit-rlhf export`` round trips on tiny models: a module trained one step by the CLI's own
config, saved as a Lightning checkpoint, exported with ``main(["export", ...])``; the folder
loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (chat template included), holds the
module's network's weights and answers a few prompts greedily as the module's network does.
PPO (the Countdown config), the generative judge, DPO with LoRA merged and as a peft adapter,
and every refusal of bad input. The ZeRO-3 folder: tests/distributed/test_export_zero3.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf.cli import cli_main, main
from lit_rlhf.cli.checkpoints import CheckpointError
from lit_rlhf.cli.export import ExportError
from lit_rlhf.models import resolve
from lit_rlhf.models.lora import merged_copy

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PPO = str(CONFIGS / "ppo" / "countdown_tiny.yaml")
GRM = str(CONFIGS / "grm" / "rft_tiny.yaml")
DPO = str(CONFIGS / "dpo" / "tiny.yaml")
PROMPTS = ["Using the numbers [3, 5, 7], make 15.", "Which response is better?", "17 + 25 ="]
QUIET = [
    "--trainer.logger=false", "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
    "--trainer.callbacks=[]",
]  # fmt: skip


def train_and_save(
    config: str, root: Path, *overrides: str, perturb: bool = True
) -> tuple[Any, Path]:
    """One optimizer step of ``config`` through the CLI, the exported network then (``perturb``)
    moved by a random offset (a random tiny model's one step may leave it where it started:
    equal rewards give zero advantages), saved as a Lightning checkpoint. Returns (module,
    checkpoint)."""
    cli = cli_main(
        ["--config", config, *QUIET, "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
         f"--trainer.default_root_dir={root}", *overrides],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    network, _ = cli.model.export_network()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in network.parameters():
            if perturb and param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    path = root / "trained.ckpt"
    cli.trainer.save_checkpoint(path)
    return cli.model, path


def export(config: str, ckpt: Path, out: Path, *flags: str) -> Path:
    main(["export", "--config", config, f"--ckpt_path={ckpt}", f"--out={out}", *flags])
    return out


def greedy(model: Any, tokenizer: Any, prompts: list[str] = PROMPTS) -> list[list[int]]:
    """Greedy continuations (8 new tokens) of ``prompts``, one at a time (no padding)."""
    answers = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
            max_new_tokens=8, min_new_tokens=8, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        answers.append(out[0, ids.shape[1] :].tolist())
    return answers


def assert_round_trip(network: Any, tokenizer: Any, out: Path, prompts: list[str] = PROMPTS) -> Any:
    """``out`` loads with transformers, with the tokenizer's chat template, the network's
    weights and its greedy answers. Returns the loaded model."""
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    assert loaded_tokenizer.chat_template and loaded_tokenizer.chat_template == (
        tokenizer.chat_template
    )
    assert loaded_tokenizer("17 + 25 =").input_ids == tokenizer("17 + 25 =").input_ids
    plain = merged_copy(network).eval()
    own, saved = plain.state_dict(), loaded.state_dict()
    assert own.keys() == saved.keys()
    for key, value in own.items():
        torch.testing.assert_close(saved[key], value, atol=1e-6, rtol=0, msg=key)
    assert greedy(loaded, loaded_tokenizer, prompts) == greedy(plain, tokenizer, prompts)
    return loaded


@pytest.fixture(scope="module")
def ppo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return train_and_save(PPO, tmp_path_factory.mktemp("ppo"))


def test_ppo_checkpoint_exports_the_policy(ppo: tuple[Any, Path], tmp_path: Path) -> None:
    module, ckpt = ppo
    out = export(PPO, ckpt, tmp_path / "hf")
    assert_round_trip(module.policy, module.tokenizer, out)
    start = AutoModelForCausalLM.from_pretrained(resolve(module.hp.model)).state_dict()
    moved = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(not torch.equal(start[k], moved[k]) for k in start)  # the checkpoint's weights
    assert not any("critic" in p.name or "value" in p.name for p in out.iterdir())


def test_generative_judge_exports_its_policy(tmp_path: Path) -> None:
    module, ckpt = train_and_save(GRM, tmp_path)
    out = export(GRM, ckpt, tmp_path / "hf", "--dtype=float32")
    assert_round_trip(module.policy, module.tokenizer, out)


def test_dpo_lora_merged_and_adapter_give_the_same_model(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    lora = ["--model.init_args.lora.rank=4", "--model.init_args.export_dir=null"]
    module, ckpt = train_and_save(DPO, tmp_path, *lora)
    merged = export(DPO, ckpt, tmp_path / "merged", *lora)  # --lora merged is the default
    loaded = assert_round_trip(module.model, module.tokenizer, merged)
    assert not (merged / "adapter_config.json").exists()

    adapter = export(DPO, ckpt, tmp_path / "adapter", *lora, "--lora=adapter")
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == module.hp.model  # the run's name: portable
    base = AutoModelForCausalLM.from_pretrained(
        module.model.peft_config["default"].base_model_name_or_path
    )
    with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    assert tokenizer.chat_template == module.tokenizer.chat_template
    ids = tokenizer(PROMPTS[2], return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(ids).logits, loaded(ids).logits, atol=1e-4, rtol=0)
    assert greedy(with_adapter, tokenizer) == greedy(loaded, tokenizer)


def test_push_to_hub_dry_run_lists_the_files_and_uploads_nothing(
    ppo: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import huggingface_hub

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run uploaded")

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", refuse)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    out = export(PPO, ppo[1], tmp_path / "hf", "--push_to_hub=me/tiny-ppo", "--dry_run=true")
    printed = capsys.readouterr().out
    assert "dry run, nothing uploaded" in printed and "me/tiny-ppo" in printed
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        assert f"  {name}  " in printed and (out / name).is_file()


def test_overwrite_replaces_a_previous_export_only(ppo: tuple[Any, Path], tmp_path: Path) -> None:
    out = export(PPO, ppo[1], tmp_path / "hf")
    with pytest.raises(ExportError, match=r"exists and is not empty .* Fix: .*--overwrite true"):
        export(PPO, ppo[1], out)
    (out / "stale.txt").write_text("left from before")
    export(PPO, ppo[1], out, "--overwrite=true")
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"replaces only a previous export.*todo.txt"):
        export(PPO, ppo[1], other, "--overwrite=true")
    assert (other / "todo.txt").is_file()


@pytest.mark.parametrize(
    ("config", "flags", "error", "cause"),
    [
        (PPO, ["--ckpt_path=/nonexistent/x.ckpt"], ExportError, r"/nonexistent/x.ckpt: no such"),
        (DPO, [], CheckpointError, r"a checkpoint of lit_rlhf.modules.PPOModule, but .*DPOModule"),
        (PPO, ["--lora=adapter"], ExportError, r"--lora adapter: PPOModule's network has no LoRA"),
        (PPO, ["--dry_run=true"], ExportError, r"--dry_run applies to --push_to_hub only"),
        (PPO, ["--push_to_hub=me/x"], ExportError, r"HF_HUB_OFFLINE is set.*--dry_run true"),
        (PPO, ["--push_to_hub=not a/repo id!"], ExportError, r"not a hub repo id"),
        (PPO, ["--model.init_args.model=builtin:tiny-qwen2"], CheckpointError,
         r"not those of the PPOModule.policy the config builds .* Fix: export with"),
        (str(CONFIGS / "compressor" / "tiny.yaml"), [], ExportError,
         r"CompressorDecoderModule has no exported network"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_fix(
    ppo: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    config: str, flags: list[str], error: type[Exception], cause: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(error, match=cause):
        export(config, ppo[1], tmp_path / "hf", *flags)
    assert not (tmp_path / "hf").exists()


def test_help_offers_the_export_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["export", "--help"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    for option in ("--ckpt_path", "--out", "--lora", "--dtype", "--overwrite", "--push_to_hub",
                   "--dry_run"):  # fmt: skip
        assert option in printed
    assert printed.startswith("usage: lit-rlhf export")
    with pytest.raises(SystemExit):
        main(["--help"])  # the root help names the subcommand LightningCLI does not know
    assert "lit-rlhf export --config" in capsys.readouterr().out


def test_ppo_lora_exports_merged_and_as_adapter(tmp_path: Path) -> None:
    """PPO with LoRA adapters on its policy: the merged folder is the policy with the adapters
    applied, and the adapter folder on its base gives the same logits."""
    peft = pytest.importorskip("peft")
    lora = ["--model.init_args.lora.rank=4"]
    module, ckpt = train_and_save(PPO, tmp_path, *lora)
    assert hasattr(module.policy, "peft_config"), "lora.rank > 0 wraps the policy with peft"
    merged = assert_round_trip(
        module.policy, module.tokenizer, export(PPO, ckpt, tmp_path / "m", *lora)
    )
    adapter = export(PPO, ckpt, tmp_path / "a", *lora, "--lora=adapter")
    base = AutoModelForCausalLM.from_pretrained(resolve(module.hp.model))
    with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
    ids = module.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(ids).logits, merged(ids).logits, atol=1e-4, rtol=0)
