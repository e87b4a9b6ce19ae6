"""The two sides of the peer benchmark (``peer_trl``): lit-rlhf's ``PPOModule`` and TRL's
``GRPOTrainer`` on the same GRPO workload, each timing every optimizer step and the generation
inside it. ``opts`` carries the workload: ``prompts``, ``samples``, ``new_tokens``,
``micro_batch_tokens``, ``max_staleness``."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from scripts.bench.runner import StepTimer, Timed, fit

PROMPTS_PER_STEP, LR = 8, 1e-6
QUESTION = "Use the numbers {numbers} to make {target}."  # 13-16 tokens
OVERLAP_KEYS = ("time/generate_s", "time/update_s", "time/wait_s", "rollout/overlap")


def prompt_source(opts: Any) -> Any:
    from lit_rlhf.data import CountdownPrompts

    return CountdownPrompts(num_examples=opts.prompts, seed=0, question_template=QUESTION)


def prompt_stats(opts: Any, model: str) -> tuple[Any, float]:
    """The model's config and the mean prompt length in tokens."""
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    questions = list(prompt_source(opts).load()["question"])
    lengths = [len(ids) for ids in load_tokenizer(model)(questions).input_ids]
    return load_causal_lm(model).config, sum(lengths) / len(lengths)


def profiled(opts: Any) -> Any:  # peer_trl --profile's step hook, else None
    return getattr(getattr(opts, "profiler", None), "step", None)


def make_engine(kind: str, new_tokens: int) -> Any:
    from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine, VLLMGenerationEngine

    sampling: dict[str, Any] = dict(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0)
    if kind == "vllm":  # compiled (not enforce_eager): ~30 s of start-up, in the first warm-up
        return VLLMGenerationEngine(**sampling, kv_cache_memory_bytes=256 << 20,
                                    max_model_len=new_tokens + 64)  # fmt: skip
    if kind in ("decode", "decode_eager"):
        return DecodeLoopEngine(**sampling, cache="static", compile=kind == "decode")
    return HFGenerationEngine(**sampling)


def run_lit_rlhf(opts: Any, model: str, beta: float, steps: int, engine: str) -> dict[str, Any]:
    """Per step: seconds, seconds in generation, mean response length, one-step-off's timings."""
    import lightning as L

    from lit_rlhf.data import PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import DigitFractionReward

    gen = make_engine(engine, opts.new_tokens)
    gen.generate = timed = Timed(gen.generate)
    probes = {k: (lambda key: lambda t, _: t.callback_metrics.get(key, float("nan")))(k)
              for k in ("rollout/response_length", *OVERLAP_KEYS)}  # fmt: skip
    timer = StepTimer({"gen": lambda: timed.seconds}, probes, on_start=profiled(opts))
    L.seed_everything(0, verbose=False)
    data = PromptDataModule(tokenizer=model, train=prompt_source(opts),
                            batch_size=PROMPTS_PER_STEP, use_chat_template=False)  # fmt: skip
    module = PPOModule(
        reward=DigitFractionReward(), model=model, tokenizer=data.tokenizer, engine=gen,
        rollout={"samples_per_prompt": opts.samples, "max_staleness": opts.max_staleness},
        advantage={"estimator": "grpo"},
        optim={"micro_batch_size": PROMPTS_PER_STEP * opts.samples, "lr": LR,
               "max_grad_norm": 1.0},
        # None: padded micro-batches of the rollout
        update={"micro_batch_tokens": opts.micro_batch_tokens},
        loss={"clip_low": 0.2, "clip_high": 0.2}, kl={"coef": beta, "estimator": "k3"},
    )  # fmt: skip
    fit(module, [timer], data, limit_train_batches=steps)
    return {"times": timer.column("step"), "gen": timer.column("gen"),
            "lengths": timer.column("rollout/response_length"),
            "overlap": {k: timer.column(k) for k in OVERLAP_KEYS}}  # fmt: skip


def trl_config(opts: Any, out: str, beta: float, steps: int) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out, per_device_train_batch_size=PROMPTS_PER_STEP * opts.samples,
        gradient_accumulation_steps=1, num_generations=opts.samples,
        max_completion_length=opts.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", beta=beta, epsilon=0.2, num_iterations=1,
        loss_type="dapo", max_grad_norm=1.0, bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, max_steps=steps, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=0, model_init_kwargs={"dtype": torch.float32},
    )  # fmt: skip


def run_trl(opts: Any, model: str, beta: float, steps: int) -> dict[str, Any]:
    """TRL's side: the same rows as :func:`run_lit_rlhf` (no one-step-off timings)."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from lit_rlhf.models import load_tokenizer
    from lit_rlhf.models.builtin import resolve_builtin
    from lit_rlhf.rewards import DigitFractionReward

    questions = list(prompt_source(opts).load()["question"])
    score = DigitFractionReward()

    def digit_fraction(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [float(s) for s in score(prompts, completions, [{}] * len(completions)).scores]

    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(model=resolve_builtin(model), reward_funcs=[digit_fraction],
                              args=trl_config(opts, out, beta, steps),
                              train_dataset=datasets.Dataset.from_dict({"prompt": questions}),
                              processing_class=load_tokenizer(model))  # fmt: skip
        trainer.model.generate = timed = Timed(trainer.model.generate)  # type: ignore[method-assign]
        timer = StepTimer({"gen": lambda: timed.seconds}, on_start=profiled(opts))

        class Hooks(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                timer.on_train_batch_start()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                timer.on_train_batch_end(None, None, None)

        trainer.add_callback(Hooks())
        trainer.train()
        log = trainer.state.log_history
    lengths = [float(e["completions/mean_length"]) for e in log if "completions/mean_length" in e]
    return {"times": timer.column("step"), "gen": timer.column("gen"), "lengths": lengths}
