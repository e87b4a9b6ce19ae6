"""A catalogue of bad inputs, tried as a new user would: each must fail when the object is built
(before any model loads, where the check needs no model) with an error that names the problem
and the fix, or fall back in a documented way that is logged or warned.

Everything here builds objects directly; two cases load the random 0.1M-parameter builtin
models (a checkpoint of another model) and one runs ``fast_dev_run`` with sockets blocked.
"""

from __future__ import annotations

import builtins
import importlib.util
import re
import socket
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning import Trainer

from lit_rlhf.algos.judge import parse_verdict
from lit_rlhf.callbacks import (
    AdaptiveKL,
    CompressionDiagnostics,
    ConsistencyAnswerReward,
    CritiqueConsistencyReward,
    EntropyBonus,
    ModularGradientSurgery,
    TrustRegionEntropy,
)
from lit_rlhf.cli import cli_main
from lit_rlhf.modules import (
    CompressorDecoderModule,
    GenerativeRewardModule,
    PPOModule,
    RewardModelModule,
)
from lit_rlhf.rewards import CountdownReward, MathReward, VerdictReward
from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine, VLLMGenerationEngine
from lit_rlhf.settings import RolloutSettings, UpdateSettings
from lit_rlhf.training import PolicyLossContext, PPOSettings

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "ppo" / "countdown_tiny.yaml")
REWARD = CountdownReward()


@pytest.fixture(autouse=True)
def _argv_of_the_cli(monkeypatch):
    """``cli_main(args)`` as from the console script (pytest's own argv would be reported)."""
    monkeypatch.setattr("sys.argv", ["lit-rlhf"])


def last_stderr_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[str, str]:
    """Run the CLI on ``args`` expecting a refused configuration; (all of stderr, last line)."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    return err, err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------ CLI: parsing
@pytest.mark.parametrize(
    ("extra", "last_line"),
    [
        # an unknown key: the key, the cause, and how to find the accepted ones
        (
            ["--model.init_args.max_lenght=3"],
            r"^error: model\.init_args\.max_lenght: Option 'max_lenght' is not accepted\. "
            r"Fix: remove model\.init_args\.max_lenght or correct its spelling; did you mean "
            r"[a-z_.]+\? \(`--model\.help lit_rlhf\.modules\.PPOModule` lists its settings\)",
        ),
        # a wrong type
        (
            ["--model.init_args.optim.lr=fast"],
            r"^error: model\.init_args\.optim\.lr: Expected a <class 'float'>\. Got value: fast\. "
            r"Fix: give model\.init_args\.optim\.lr a value of the expected type",
        ),
        # a wrong type two classes deep (the reward inside the module)
        (
            ["--model.init_args.reward.init_args.tolerance=abc"],
            r"^error: model\.init_args\.reward\.init_args\.tolerance: Expected a <class "
            r"'float'>.*Fix: give .*the arguments of lit_rlhf\.rewards\.CountdownReward",
        ),
        # an unknown key of the data module
        (
            ["--data.init_args.batchsize=3"],
            r"^error: data\.init_args\.batchsize: Option 'batchsize' is not accepted\. Fix: "
            r"remove .*\(`--data\.help lit_rlhf\.data\.PromptDataModule`",
        ),
        # a value outside a Literal
        (
            ["--model.init_args.advantage.estimator=ppo"],
            r"^error: model\.init_args\.advantage\.estimator: Expected a typing\.Literal\["
            r"'gae', 'grpo', "
            r"'rloo', 'reinforce_pp', 'reinforce_pp_baseline'\]\. Got value: ppo\. Fix:",
        ),
        # a class that does not exist
        (
            ["--model.init_args.reward=lit_rlhf.rewards.Nope"],
            r"^error: model\.init_args\.reward: module 'lit_rlhf\.rewards' has no attribute "
            r"'Nope'\. Fix: correct this setting",
        ),
        # LightningCLI's optimizer options: not offered, and the error says what to do instead
        (
            ["--optimizer=Adam"],
            r"^error: unrecognized arguments: --optimizer=Adam\. Fix: leave them out: each "
            r"module builds its own AdamW from model\.init_args\.optim\.lr",
        ),
        (
            ["--lr_scheduler=StepLR"],
            r"^error: unrecognized arguments: --lr_scheduler=StepLR\. Fix: leave them out",
        ),
    ],
    ids=["unknown-key", "wrong-type", "nested-type", "data-key", "literal", "no-class",
         "optimizer", "lr-scheduler"],
)  # fmt: skip
def test_cli_refusal_ends_with_the_cause(capsys, extra, last_line):
    err, last = last_stderr_line(capsys, ["fit", "--config", TINY, *extra])
    assert re.search(last_line, last), last
    assert "Given value" not in err and "Namespace(" not in err  # no dump of the input
    assert len(err.splitlines()) < 20  # the cause, not a usage page


def test_cli_missing_config_file_names_it(capsys, tmp_path):
    missing = tmp_path / "nope.yaml"
    _, last = last_stderr_line(capsys, ["fit", "--config", str(missing)])
    assert re.search(rf"^error: config: File does not exist: '{re.escape(str(missing))}'", last)


# ------------------------------------------------------------------ CLI: building the classes
@pytest.mark.parametrize(
    ("extra", "error", "message"),
    [
        # today's "gradient ascent" run: refused, the reason said
        (["--model.init_args.optim.lr=-1"], ValueError,
         r"optim\.lr=-1\.0 must be > 0 and finite \(a negative lr would ascend the loss\)\. "
         r"Fix: set model\.init_args\.optim\.lr"),
        # a negative KL coefficient no longer turns the KL off silently
        (["--model.init_args.kl.coef=-0.1"], ValueError,
         r"kl\.coef=-0\.1 must be >= 0 .*Fix: set model\.init_args\.kl\.coef"),
        (["--model.init_args.reward.init_args.tolerance=-1"], ValueError,
         r"tolerance must be finite and >= 0 \(e\.g\. 1e-5\), got -1\.0"),
        (["--data.init_args.batch_size=0"], ValueError, r"batch_size must be >= 1, got 0"),
        (["--model.init_args.engine.init_args.top_p=2"], ValueError,
         r"top_p must be in \(0, 1\] \(1\.0 disables it\), got 2\.0"),
    ],
    ids=["negative-lr", "negative-kl", "reward-tolerance", "batch-size-0", "top-p"],
)  # fmt: skip
def test_cli_class_error_is_the_last_line(extra, error, message):
    with pytest.raises(error, match=message) as info:
        cli_main(["fit", "--config", TINY, *extra])
    printed = "".join(traceback.format_exception(info.value)).strip().splitlines()
    assert re.search(message, printed[-1]), printed[-1]  # what the user reads last
    assert not any("Namespace(" in line for line in printed)


def _built(cls: Any, **kwargs: Any) -> Any:
    module = cls(**kwargs)
    module.configure_model()
    return module


def test_ppo_checkpoint_of_another_model_names_both():
    saved = _built(PPOModule, reward=REWARD, model="builtin:tiny-llama")
    checkpoint = {"state_dict": saved.state_dict(), "hyper_parameters": dict(saved.hparams)}
    other = _built(PPOModule, reward=REWARD, model="builtin:tiny-qwen2")
    with pytest.raises(
        ValueError,
        match=r"not this module's networks \(model: checkpoint "
        r"'builtin:tiny-llama', this module 'builtin:tiny-qwen2'\).*Fix: "
        r"configure the module as the checkpoint was trained \(model\)",
    ):
        other.on_load_checkpoint(checkpoint)
    saved.on_load_checkpoint(checkpoint)  # its own checkpoint loads


def test_compressor_checkpoint_of_another_memory_size_names_both():
    saved = _built(CompressorDecoderModule, num_memory_tokens=4)
    checkpoint = {"hyper_parameters": dict(saved.hparams)}
    checkpoint["state_dict"] = saved.state_dict()
    saved.on_save_checkpoint(checkpoint)  # the frozen decoder is left out, as in a real file
    assert not any(k.startswith("decoder.") for k in checkpoint["state_dict"])
    other = _built(CompressorDecoderModule, num_memory_tokens=8)
    with pytest.raises(
        ValueError,
        match=r"not this module's networks \(num_memory_tokens: checkpoint 4, this module 8\)"
        r".*of another shape",
    ):
        other.on_load_checkpoint(checkpoint)
    saved.on_load_checkpoint(checkpoint)  # its own checkpoint loads (decoder rebuilt)


def test_reward_model_checkpoint_of_another_model_names_both():
    saved = _built(RewardModelModule, model="builtin:tiny-llama")
    checkpoint = {"state_dict": saved.state_dict(), "hyper_parameters": dict(saved.hparams)}
    other = _built(RewardModelModule, model="builtin:tiny-qwen2")
    with pytest.raises(
        ValueError,
        match=r"model: checkpoint 'builtin:tiny-llama', this module "
        r"'builtin:tiny-qwen2'",
    ):
        other.on_load_checkpoint(checkpoint)


# ---------------------------------------------------------------------- module settings
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(optim={"lr": float("inf")}), r"optim\.lr=inf must be > 0 and finite"),
        (dict(critic={"lr": 0.0}), r"critic\.lr=0\.0 must be > 0 and finite\. Fix:"),
        (dict(loss={"clip_low": 1.5}),
         r"clip_low=1\.5 must be in \(0, 1\): the ratio's lower bound"),
        (dict(loss={"clip_high": 0.0}), r"clip_high=0\.0 must be > 0"),
        (dict(loss={"dual_clip": 0.5}), r"dual_clip=0\.5 must be > 1 \(it caps the loss"),
        (dict(optim={"micro_batch_size": 0}), r"optim\.micro_batch_size=0 must be an integer >= 1"),
        (dict(rollout={"samples_per_prompt": 1}),
         r"advantage\.estimator='grpo' compares samples of the same prompt.*Fix: set "
         r"rollout\.samples_per_prompt >= 2, or advantage\.estimator: gae"),
        (dict(optim={"max_grad_norm": -1.0}),
         r"optim\.max_grad_norm=-1\.0 must be > 0, or null \(no clipping\)"),
        (dict(eval={"pass_threshold": float("nan")}), r"eval\.pass_threshold=nan must be finite"),
    ],
    ids=["lr-inf", "critic-lr", "clip-low", "clip-high", "dual-clip", "micro-batch", "grpo-G1",
         "max-grad-norm", "pass-threshold"],
)  # fmt: skip
def test_ppo_settings_out_of_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOModule(REWARD, **kwargs)


def test_mini_batch_that_does_not_divide_the_rollout():
    settings = PPOSettings(
        rollout=RolloutSettings(samples_per_prompt=4), update=UpdateSettings(mini_batch_size=6)
    )
    with pytest.raises(
        ValueError,
        match=r"update\.mini_batch_size=6 does not divide the rollout of 4 "
        r"prompts x rollout\.samples_per_prompt=4 = 16 sequences.*Fix: set "
        r"model\.init_args\.update\.mini_batch_size to a divisor of 16 \(e\.g\. 8\), or null",
    ):
        settings.check_rollout_size(4)
    settings.check_rollout_size(3)  # 12 sequences: two steps of 6


def _stub_module(module: Any, **data: Any) -> Any:
    """``module`` as :meth:`PolicyStep.check_data` sees it at setup, with a stub datamodule."""
    trainer = SimpleNamespace(datamodule=SimpleNamespace(**data))
    return SimpleNamespace(trainer=trainer, hparams=module.hparams)


def test_prompt_and_response_longer_than_the_models_context():
    module = PPOModule(REWARD, engine=HFGenerationEngine(max_new_tokens=64))  # tiny-llama: 1024
    with pytest.raises(
        ValueError,
        match=r"the longest prompt has 1000 tokens and the engine "
        r"generates up to max_new_tokens=64: 1064 positions, more than the 1024 of "
        r"'builtin:tiny-llama'.*Fix: lower data\.init_args\.max_prompt_length",
    ):
        module.rl.check_data(_stub_module(module, batch_size=4, longest_prompt=1000))
    module.rl.check_data(_stub_module(module, batch_size=4, longest_prompt=900))


def test_judge_settings():
    with pytest.raises(
        ValueError,
        match=r"optim\.lr=-1\.0 must be > 0 and finite .*Fix: set "
        r"model\.init_args\.optim\.lr",
    ):
        GenerativeRewardModule(optim={"lr": -1.0})
    with pytest.raises(
        ValueError,
        match=r"judge\.inference='single' judges each pair once.*Fix: set "
        r"judge\.eval_samples: 1",
    ):
        GenerativeRewardModule(judge={"inference": "single", "eval_samples": 3})


def test_consistrm_without_its_callbacks_fails_at_setup():
    module = GenerativeRewardModule(mode="consistrm", rollout={"samples_per_prompt": 4})
    module.trainer = Trainer(logger=False, enable_checkpointing=False, callbacks=[])
    with pytest.raises(
        ValueError,
        match=r"mode='consistrm' takes its answer reward from "
        r"reward-term callbacks.*Fix: add lit_rlhf\.callbacks\."
        r"ConsistencyAnswerReward",
    ):
        module.setup("fit")
    assert module.policy is None  # refused before any model loaded


def test_reward_model_and_compressor_settings():
    with pytest.raises(
        ValueError,
        match=r"margin=-1 must be >= 0 and finite \(0: plain Bradley-Terry\)\. Fix: set "
        r"model\.init_args\.margin in that range",
    ):
        RewardModelModule(margin=-1)
    with pytest.raises(
        ValueError,
        match=r"loss weights must be >= 0 and not both 0.*Fix: "
        r"ae_weight: 1\.0",
    ):
        CompressorDecoderModule(ae_weight=0.0, lm_weight=0.0)
    with pytest.raises(
        ValueError,
        match=r"set either num_memory_tokens \(4\) or "
        r"compression_rate \(2\.0\), not both\. Fix: drop one",
    ):
        CompressorDecoderModule(num_memory_tokens=4, compression_rate=2.0)


# ----------------------------------------------------------------------------------- engines
@pytest.mark.parametrize(
    ("engine", "kwargs", "message"),
    [
        (HFGenerationEngine, dict(top_k=-1), r"top_k must be >= 0 \(0 disables it\), got -1"),
        (HFGenerationEngine, dict(top_p=1.5), r"top_p must be in \(0, 1\] \(1\.0 disables it\)"),
        (HFGenerationEngine, dict(temperature=0.0), r"temperature must be > 0, got 0\.0; for "
         r"greedy decoding call generate\(\.\.\., greedy=True\)"),
        (HFGenerationEngine, dict(temperature=float("nan")), r"temperature must be > 0, got nan"),
        (DecodeLoopEngine, dict(top_k=-1), r"top_k must be >= 0 \(0 disables it\), got -1"),
        (DecodeLoopEngine, dict(max_new_tokens=0), r"max_new_tokens must be >= 1, got 0"),
    ],
    ids=["hf-top-k", "hf-top-p", "hf-temperature-0", "hf-temperature-nan", "decode-top-k",
         "decode-max-new-tokens"],
)  # fmt: skip
def test_sampling_settings_out_of_range(engine, kwargs, message):
    with pytest.raises(ValueError, match=message):
        engine(**kwargs)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_vllm_fails_when_built():
    with pytest.raises(
        ImportError,
        match=r"needs vLLM, which is not installed.*Fix: `pip "
        r"install vllm` \(GPU\) or, on CPU, `make venv-vllm`",
    ):
        VLLMGenerationEngine()


def test_deepspeed_strategy_without_deepspeed(monkeypatch):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    monkeypatch.setattr("lightning.pytorch.strategies.deepspeed._DEEPSPEED_AVAILABLE", False)
    with pytest.raises(
        Exception,
        match=r"you must have DeepSpeed installed\. Install it by "
        r"running `pip install -U deepspeed`",
    ):
        DeepSpeedStrategy(stage=2)


def test_gradient_surgery_refuses_zero3():
    from lit_rlhf.strategies import CPUDeepSpeedStrategy

    trainer = SimpleNamespace(strategy=CPUDeepSpeedStrategy(stage=3))
    with pytest.raises(
        NotImplementedError,
        match=r"ModularGradientSurgery needs one "
        r"gradient per task.*ZeRO-3.*Fix: use ZeRO stage 1 or 2",
    ):
        ModularGradientSurgery().setup(trainer, None, "fit")


# --------------------------------------------------------------------------------- callbacks
@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: TrustRegionEntropy(mode="topk", k=1), ValueError,
         r"k=1\): a region of one token has entropy 0, so the term would be inert\. Fix: k >= 2"),
        (lambda: TrustRegionEntropy(mode="topp", max_candidates=1), ValueError,
         r"max_candidates=1\): a region of one token .*Fix: max_candidates >= 2"),
        (lambda: TrustRegionEntropy(mode="topp", p=1.5), ValueError,
         r"p \(the TRE-P mass threshold\) must be in \(0, 1\], got 1\.5"),
        (lambda: TrustRegionEntropy(alpha=-0.001), ValueError,
         r"alpha=-0\.001 must be >= 0 \(a negative weight turns the entropy bonus into an "
         r"entropy penalty\)\. Fix:"),
        (lambda: EntropyBonus(chunk_size=0), ValueError, r"chunk_size must be >= 1"),
        (lambda: AdaptiveKL(init_kl_coef=0.0), ValueError,
         r"AdaptiveKL needs init_kl_coef > 0, target > 0 and horizon > 0"),
        (lambda: ModularGradientSurgery(granularity="neuron"), ValueError,  # type: ignore[arg-type]
         r"granularity must be one of \('tensor', 'module', 'layer', 'global'\)"),
        (lambda: CompressionDiagnostics(probes=-1), ValueError,
         r"probes must be >= 0 \(0: no probes\), got -1"),
        (lambda: ConsistencyAnswerReward(initial_memory="/no/such/memory.jsonl"),
         FileNotFoundError, r"initial_memory '/no/such/memory\.jsonl' is not a file"),
        (lambda: CritiqueConsistencyReward(bonus=-1.0), ValueError, r"bonus must be >= 0"),
    ],
    ids=["tre-k1", "tre-one-candidate", "tre-p", "tre-negative-alpha", "entropy-chunk",
         "adaptive-kl", "mgs-granularity", "compression-probes", "consistrm-memory",
         "critique-bonus"],
)  # fmt: skip
def test_callback_arguments(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_adaptive_kl_needs_a_kl_before_models_load():
    module = PPOModule(REWARD, kl={"coef": 0.0})
    with pytest.raises(
        ValueError,
        match=r"AdaptiveKL needs a module with a `kl_coef` attribute "
        r"> 0.*Fix: set model\.init_args\.kl\.coef > 0",
    ):
        AdaptiveKL().setup(None, module, "fit")  # type: ignore[arg-type]
    assert module.policy is None


def test_tre_with_a_p_that_leaves_one_token_warns_once():
    tre = TrustRegionEntropy(mode="topp", p=0.5)
    logits = torch.tensor([[[5.0, 0.0, 0.0, 0.0]] * 3])  # top-1 mass 0.95 >= p everywhere
    zeros = torch.zeros(1, 3)
    ctx = PolicyLossContext(logits, zeros, zeros, zeros, torch.ones(1, 3, dtype=torch.bool), zeros)
    with pytest.warns(
        UserWarning,
        match=r"p=0\.5\): every response token of the first "
        r"micro-batch has a one-token region.*Fix: raise p",
    ):
        term, _ = tre.policy_loss_term(None, None, ctx)
    assert torch.equal(term, torch.zeros(1, 3))  # the documented value: the term is inert


# ----------------------------------------------------------------- rewards: untrusted text
@pytest.mark.parametrize(
    "answer",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "9**9**9**9",
        "(1+2)*" * 200_000 + "3",
        "(" * 50_000 + "1" + ")" * 50_000,
        "99999999*" * 40 + "1",
    ],
    ids=["code", "huge-exponent", "1mb", "deep-nesting", "big-product"],
)
def test_countdown_never_runs_the_answer(monkeypatch, answer):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("model output reached eval/exec")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    start = time.perf_counter()
    out = REWARD(["p"], [f"<answer>{answer}</answer>"], [{"numbers": [1, 2, 3], "target": 6}])
    assert time.perf_counter() - start < 1.0
    assert out.scores.tolist() == [0.0] and out.info["format_ok"].tolist() == [0.0]


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{" + "\\frac{" * 5000 + "}",
        "\\boxed{" + "1+" * 500_000 + "1}",  # 1 MB
        "x" * 1_000_000,
        "\\boxed{9^{9^{9^{9}}}}",  # a naive evaluator would never return
    ],
    ids=["frac-5000", "1mb-boxed", "1mb-text", "tower"],
)
def test_math_reward_is_bounded_in_time(completion):
    reward = MathReward(timeout_seconds=1)
    start = time.perf_counter()
    out = reward(["p"], [completion], [{"answer": "1"}])
    assert time.perf_counter() - start < 5.0
    assert out.scores.tolist() == [0.0]


def test_judge_output_without_a_verdict_scores_invalid():
    assert parse_verdict("Both responses are fine.") is None
    assert parse_verdict("<Result>Response 1 is great</Result>") is None
    assert parse_verdict("<Result>" * 100_000) is None
    row = {"query": "q", "response_1": "a", "response_2": "b", "label": -1}
    out = VerdictReward()(["p"], ["no verdict here"], [row])
    # the documented fallback: the `invalid` score, logged as reward/format_ok = 0
    assert out.scores.tolist() == [-3.0] and out.info["format_ok"].tolist() == [0.0]


def test_rewards_never_evaluate_text_as_python():
    """Static check: no eval / exec / compile / __import__ on text in the rewards or the
    parsers of model output (``ast.literal_eval``, ``re.compile`` and ``model.eval()`` are
    not that)."""
    forbidden = re.compile(r"(?<![\w.])(eval|exec|compile|__import__)\s*\(")
    files = [*(ROOT / "lit_rlhf" / "rewards").glob("*.py"), ROOT / "lit_rlhf/algos/judge.py"]
    assert len(files) > 5
    hits = [f"{f.name}: {m.group(0)}" for f in files for m in forbidden.finditer(f.read_text())]
    assert hits == []


# ------------------------------------------------------------------------- no network at run time
def test_training_runs_with_sockets_blocked(tmp_path, monkeypatch):
    """No network at run time: a training run with every outgoing connection refused succeeds,
    and nothing even tried one (a library that swallows the refusal would still be caught)."""
    attempts: list[Any] = []

    def no_network(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1:] or kwargs)
        raise OSError("network access attempted during a run")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    cli = cli_main(
        [
            "fit",
            "--config",
            TINY,
            "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert cli.trainer.state.finished and cli.model.rollout_step == 1
    assert attempts == []
