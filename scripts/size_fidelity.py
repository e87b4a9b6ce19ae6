"""The size-fidelity sweep (arXiv 2602.09789): compressors of growing size against one frozen
decoder; per size, training loss, reconstruction fidelity, probe outcomes, effective rank of the
memory and the decoder's entropy.

Two presets; every setting a run uses is resolved first and printed at start (``--print-settings``
prints it and exits without training). A flag given explicitly overrides the preset's value.

- ``cpu`` (default, no downloads, about 10 minutes alone on 2 cores with 2 seeds): the decoder is
  the random ``builtin:tiny-llama`` given the offline text sample's language first
  (``pretrain_on_texts``; a random frozen decoder cannot be steered), the compressors are random
  Llamas of growing width and depth with the same tokenizer, each pretrained on the same text for
  the same number of steps (so each has a prior of its own); 400 steps of 16-token contexts into
  8 memory tokens, AdamW lr 1e-2, full fine-tuning, float32.
- ``gpu``: exactly the presets ``configs/compressor/qwen2.5_{0.5b,1.5b,7b}.yaml`` (ICAE's
  pretraining recipe, arXiv 2307.06945; every setting and deviation in docs/recipes.md): Qwen2.5
  0.5B / 1.5B / 7B compressors against the frozen Qwen2.5-1.5B decoder, LoRA rank 128 on q/v,
  512-token contexts into 128 memory tokens, lr 1e-4 with 300 warmup steps then linear decay,
  256 contexts per step, 5000 steps, float32 compressor under bf16-mixed, bf16 decoder, MiniPile
  (``JeanKaddour/minipile``) by hub id.

    python scripts/size_fidelity.py [--seeds 0 1] [--steps 400] [--out runs/size_fidelity]
    python scripts/size_fidelity.py --preset gpu --print-settings
    python scripts/size_fidelity.py --preset gpu --seeds 0 [--compressors Qwen/Qwen2.5-0.5B ...]

Each compressor is trained through ``CompressorDecoderModule`` and validated with
``CompressionDiagnostics``. Writes ``<out>/results.md`` (mean ± std over seeds per compressor),
``<out>/runs.json``, ``<out>/settings.json`` and ``<out>/size_fidelity.png``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _runs import mean_spread

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"
GPU_CONFIGS = [
    REPO / "configs" / "compressor" / f"qwen2.5_{s}.yaml" for s in ("0.5b", "1.5b", "7b")
]
# (hidden, layers, heads): the CPU compressors, from 0.05M to 3.6M non-embedding parameters
CPU_SIZES = [(32, 1, 2), (64, 2, 4), (128, 3, 4), (256, 4, 4), (384, 6, 6)]
CPU: dict[str, Any] = {"steps": 400, "pretrain_steps": 300, "context_tokens": 16}
CPU |= {"memory_tokens": 8, "batch_size": 8, "lr": 1e-2, "lora_rank": 0, "val_chunks": 64}
CPU |= {"probes": 12}
COLUMNS = [
    ("train/ae_loss", "train AE loss (last 50)"),
    ("val/ae_loss", "val AE loss"),
    ("val/memory_gain", "memory gain"),
    ("val/rougeL", "ROUGE-L"),
    ("val/token_f1", "token F1"),
    ("val/bleu", "BLEU"),
    ("val/probe/overwrite/kept", "overwrite kept"),
    ("val/probe/overwrite/overwritten", "overwritten"),
    ("drift/drifted", "drift drifted"),
    ("val/effective_rank", "erank"),
    ("val/pooled_effective_rank", "pooled erank"),
    ("val/decoder_entropy", "decoder entropy"),
]


def cpu_name(hidden: int, layers: int) -> str:
    return f"compressor-h{hidden}-l{layers}"


def cpu_models(root: Path, pretrain_steps: int) -> None:
    """Build the pretrained tiny decoder and random compressors in ``root`` (cached there)."""
    from lit_rlhf.models.pretrain import pretrain_on_texts
    from lit_rlhf.models.tiny import TinyModelSpec, write_tiny_model

    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]

    def pretrained(name: str, source: str) -> None:
        out = root / name
        if not (out / "config.json").exists():
            pretrain_on_texts(source, texts, out, steps=pretrain_steps, seed=0)

    pretrained("decoder", "builtin:tiny-llama")
    for hidden, layers, heads in CPU_SIZES:
        spec = TinyModelSpec(
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=heads,
            intermediate_size=2 * hidden,
        )
        random_dir = root / f"{cpu_name(hidden, layers)}-random"
        if not (random_dir / "config.json").exists():
            write_tiny_model(random_dir, spec)
        pretrained(cpu_name(hidden, layers), str(random_dir))


# ------------------------------------------------------------------ settings
def preset_run(path: Path) -> dict[str, Any]:
    """One run's settings, exactly as the GPU preset ``path`` gives them: the module's
    arguments, the data module's, both text sources' and the trainer's."""
    config = yaml.safe_load(path.read_text())
    data = copy.deepcopy(config["data"]["init_args"])
    train, val = data.pop("train")["init_args"], data.pop("val")["init_args"]
    trainer = {
        k: config["trainer"][k] for k in ("accelerator", "devices", "precision", "max_steps")
    }
    model = copy.deepcopy(config["model"]["init_args"])
    return {
        "config": str(path.relative_to(REPO)),
        "model": model,
        "data": data,
        "train_text": train,
        "val_text": val,
        "trainer": trainer,
    }


def gpu_settings() -> dict[str, Any]:
    """The GPU preset: the runs of ``GPU_CONFIGS``, smallest compressor first."""
    runs = [preset_run(path) for path in GPU_CONFIGS]
    decoders = {run["model"]["decoder"] for run in runs}
    assert len(decoders) == 1, f"the GPU presets name several decoders: {sorted(decoders)}"
    callbacks = yaml.safe_load(GPU_CONFIGS[0].read_text())["trainer"]["callbacks"]
    probes = next(c["init_args"]["probes"] for c in callbacks if "Compression" in c["class_path"])
    return {"preset": "gpu", "decoder": decoders.pop(), "probes": probes, "runs": runs}


def cpu_settings(root: Path) -> dict[str, Any]:
    """The CPU preset: the tiny decoder and the five random compressors built in ``root``."""
    decoder = str(root / "decoder")
    chunks = {
        "path": str(SAMPLE),
        "context_tokens": CPU["context_tokens"],
        "continuation_tokens": 0,
    }
    runs = []
    for hidden, layers, _ in CPU_SIZES:
        model: dict[str, Any] = {"compressor": str(root / cpu_name(hidden, layers))}
        model["decoder"] = decoder
        model |= {"num_memory_tokens": CPU["memory_tokens"], "lr": CPU["lr"]}
        model |= {"lora_rank": CPU["lora_rank"], "dtype": "float32", "decoder_dtype": "float32"}
        runs.append(
            {
                "config": None,
                "model": model,
                "data": {"tokenizer": decoder, "batch_size": CPU["batch_size"]},
                "train_text": {**chunks, "seed": 0},
                "val_text": {**chunks, "max_chunks": CPU["val_chunks"], "seed": 1000},
                "trainer": {
                    "accelerator": "cpu",
                    "devices": 1,
                    "precision": "32-true",
                    "max_steps": CPU["steps"],
                },
            }
        )
    settings = {"preset": "cpu", "decoder": decoder, "probes": CPU["probes"], "runs": runs}
    return settings | {"pretrain_steps": CPU["pretrain_steps"]}


def with_compressors(settings: dict[str, Any], compressors: list[str]) -> None:
    """GPU: runs for ``compressors``; one the presets name keeps its preset, another takes the
    first preset's settings with its own compressor."""
    by_name = {run["model"]["compressor"]: run for run in settings["runs"]}
    runs = []
    for name in compressors:
        run = copy.deepcopy(by_name.get(name, settings["runs"][0]))
        if name not in by_name:
            run["config"] = f"{run['config']} (settings), compressor {name}"
            run["model"]["compressor"] = name
        runs.append(run)
    settings["runs"] = runs


def apply_flags(settings: dict[str, Any], opts: argparse.Namespace) -> None:
    """The flags given explicitly (not None) override the preset's settings of every run."""
    if opts.compressors:
        if settings["preset"] == "cpu":
            raise SystemExit("--compressors is for --preset gpu (the CPU sizes are built here)")
        with_compressors(settings, opts.compressors)
    for key in ("probes", "pretrain_steps"):
        if getattr(opts, key) is not None:
            settings[key] = getattr(opts, key)
    if opts.decoder:
        settings["decoder"] = opts.decoder
    for run in settings["runs"]:
        model, data, train, val = run["model"], run["data"], run["train_text"], run["val_text"]
        if opts.decoder:
            model["decoder"] = data["tokenizer"] = opts.decoder
        if opts.text:
            for chunks in (train, val):
                chunks.update(path=opts.text, name=None, split="train", text_field="text")
        if opts.context_tokens is not None:
            model["context_tokens"] = opts.context_tokens
            train["context_tokens"] = val["context_tokens"] = opts.context_tokens
            data["max_prompt_length"] = max(data.get("max_prompt_length", 512), opts.context_tokens)
        if opts.memory_tokens is not None:
            model.update(num_memory_tokens=opts.memory_tokens, compression_rate=None)
        pairs = [(model, "lr", opts.lr), (model, "lora_rank", opts.lora_rank)]
        pairs += [(data, "batch_size", opts.batch_size), (val, "max_chunks", opts.val_chunks)]
        pairs += [(run["trainer"], "max_steps", opts.steps)]
        for target, key, value in pairs:
            if value is not None:
                target[key] = value


def resolve(opts: argparse.Namespace) -> dict[str, Any]:
    """Every setting of the sweep: the preset's, then the explicit flags."""
    settings = gpu_settings() if opts.preset == "gpu" else cpu_settings(opts.out / "models")
    apply_flags(settings, opts)
    settings["seeds"] = list(opts.seeds)
    return settings


class LossTrace:
    """Collects ``train/ae_loss`` per step (a Lightning callback, built lazily)."""

    @staticmethod
    def make() -> Any:
        import lightning as L

        class _Trace(L.Callback):
            def __init__(self) -> None:
                self.losses: list[float] = []

            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                self.losses.append(float(trainer.callback_metrics["train/ae_loss"]))

        return _Trace()


def build(run: dict[str, Any], seed: int, probes: int) -> tuple[Any, Any, Any, Any, Any]:
    """(data module, module, training trainer, validation trainer, loss trace) of one run, from
    its settings alone (plus the sweep's seed and probe count)."""
    import lightning as L

    from lit_rlhf.callbacks import CompressionDiagnostics
    from lit_rlhf.data import PromptDataModule, TextChunks
    from lit_rlhf.modules import CompressorDecoderModule

    data = PromptDataModule(
        **run["data"],
        seed=seed,
        train=TextChunks(**run["train_text"]),
        val=TextChunks(**run["val_text"]),
    )
    module = CompressorDecoderModule(**run["model"], tokenizer=data.tokenizer)
    quiet: dict[str, Any] = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    trace = LossTrace.make()
    trainer = L.Trainer(
        **run["trainer"],
        **quiet,
        enable_checkpointing=False,
        limit_val_batches=0,
        callbacks=[trace],
    )
    hardware = {k: run["trainer"][k] for k in ("accelerator", "devices", "precision")}
    validator = L.Trainer(
        **hardware, **quiet, callbacks=[CompressionDiagnostics(probes=probes, probe_seed=0)]
    )
    return data, module, trainer, validator, trace


def run_one(run: dict[str, Any], seed: int, probes: int) -> dict[str, Any]:
    """Train one compressor and validate it; returns the metrics, parameter count and time."""
    import lightning as L

    L.seed_everything(seed, verbose=False)
    data, module, trainer, validator, trace = build(run, seed, probes)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    (metrics,) = validator.validate(module, datamodule=data, verbose=False)
    assert module.compressor is not None
    params = sum(p.numel() for p in module.compressor.lm.parameters())
    metrics["train/ae_loss"] = sum(trace.losses[-50:]) / len(trace.losses[-50:])
    drift = [
        metrics[f"val/probe/{k}/drifted"]
        for k in ("role", "negation", "order")
        if f"val/probe/{k}/drifted" in metrics
    ]
    metrics["drift/drifted"] = sum(drift) / len(drift) if drift else float("nan")
    return {"metrics": metrics, "params": params, "seconds": seconds, "curve": trace.losses}


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    head = "| compressor | params | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for name, runs in results.items():
        cells = [
            mean_spread([float(r["metrics"].get(key, float("nan"))) for r in runs])
            for key, _ in COLUMNS
        ]
        lines.append(f"| {name} | {runs[0]['params'] / 1e6:.2f}M | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [COLUMNS[0], COLUMNS[3], COLUMNS[2], COLUMNS[7], COLUMNS[9], COLUMNS[11]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4))
    sizes = [runs[0]["params"] / 1e6 for runs in results.values()]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for seed in range(len(next(iter(results.values())))):
            ys = [float(runs[seed]["metrics"].get(key, float("nan"))) for runs in results.values()]
            ax.plot(sizes, ys, marker="o", label=f"seed run {seed + 1}")
        ax.set_xscale("log")
        ax.set_xlabel("compressor parameters (M)")
        ax.set_title(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--preset", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument(
        "--print-settings", action="store_true", help="print the resolved settings and exit"
    )
    parser.add_argument("--decoder", help="the frozen decoder (hub id or folder)")
    parser.add_argument("--compressors", nargs="+", help="gpu: compressors, smallest first")
    parser.add_argument("--text", help="TextChunks path (file, folder, hub id) for both splits")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--out", type=Path, default=Path("runs/size_fidelity"))
    # None: the preset's value (printed at start)
    for flag in ("steps", "pretrain-steps", "context-tokens", "memory-tokens", "batch-size"):
        parser.add_argument(f"--{flag}", type=int)
    for flag in ("lora-rank", "val-chunks", "probes"):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--lr", type=float)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = parse(argv)
    settings = resolve(opts)
    text = json.dumps(settings, indent=1)
    print(f"size_fidelity settings (preset {settings['preset']}):\n{text}", flush=True)
    if opts.print_settings:
        return settings
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "settings.json").write_text(text + "\n")
    if settings["preset"] == "cpu":
        cpu_models(opts.out / "models", settings["pretrain_steps"])
    results: dict[str, list[dict[str, Any]]] = {}
    for run in settings["runs"]:
        name = Path(run["model"]["compressor"]).name
        results[name] = [run_one(run, seed, settings["probes"]) for seed in settings["seeds"]]
        print(name, [round(r["seconds"], 1) for r in results[name]], "s", flush=True)
    table_text = table(results)
    (opts.out / "results.md").write_text(table_text + "\n")
    (opts.out / "runs.json").write_text(json.dumps(results, indent=1, default=float))
    plot(results, opts.out / "size_fidelity.png")
    print(table_text)
    return settings


if __name__ == "__main__":
    main()
