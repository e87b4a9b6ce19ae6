"""The size-fidelity sweep (arXiv 2602.09789): compressors of growing size against one frozen
decoder; per size, training loss, reconstruction fidelity, probe outcomes, effective rank of the
memory and the decoder's entropy.

CPU preset (default, no downloads, about 10 minutes alone on 2 cores with 2 seeds): the decoder
is the random ``builtin:tiny-llama`` given the offline text sample's language first
(``pretrain_on_texts``; a random frozen decoder cannot be steered), the compressors are random
Llamas of growing width and depth with the same tokenizer, each pretrained on the same text for
the same number of steps (so each has a prior of its own), then trained as compressors through
``CompressorDecoderModule`` and validated with ``CompressionDiagnostics``. GPU preset: real
families by flags, e.g.

    python scripts/size_fidelity.py [--seeds 0 1] [--steps 400] [--out runs/size_fidelity]
    python scripts/size_fidelity.py --preset gpu --decoder Qwen/Qwen2.5-1.5B \\
        --compressors Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-1.5B Qwen/Qwen2.5-7B --text <hub id or file>

Writes ``<out>/results.md`` (mean ± std over seeds per compressor) and ``<out>/size_fidelity.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _runs import mean_spread

SAMPLE = Path(__file__).resolve().parents[1] / "lit_rlhf" / "data" / "samples" / "text_sample.jsonl"
# (hidden, layers, heads): the CPU compressors, from 0.05M to 3.6M non-embedding parameters
CPU_SIZES = [(32, 1, 2), (64, 2, 4), (128, 3, 4), (256, 4, 4), (384, 6, 6)]
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


def cpu_models(root: Path, pretrain_steps: int) -> tuple[str, list[str]]:
    """The pretrained tiny decoder and the pretrained random compressors (cached in ``root``)."""
    from lit_rlhf.models.pretrain import pretrain_on_texts
    from lit_rlhf.models.tiny import TinyModelSpec, write_tiny_model

    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]

    def pretrained(name: str, source: str) -> str:
        out = root / name
        if not (out / "config.json").exists():
            pretrain_on_texts(source, texts, out, steps=pretrain_steps, seed=0)
        return str(out)

    decoder = pretrained("decoder", "builtin:tiny-llama")
    compressors = []
    for hidden, layers, heads in CPU_SIZES:
        name = f"compressor-h{hidden}-l{layers}"
        spec = TinyModelSpec(
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=heads,
            intermediate_size=2 * hidden,
        )
        random_dir = root / f"{name}-random"
        if not (random_dir / "config.json").exists():
            write_tiny_model(random_dir, spec)
        compressors.append(pretrained(name, str(random_dir)))
    return decoder, compressors


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


def run_one(compressor: str, decoder: str, seed: int, opts: argparse.Namespace) -> dict[str, Any]:
    """Train one compressor and validate it; returns the metrics, parameter count and time."""
    import lightning as L

    from lit_rlhf.callbacks import CompressionDiagnostics
    from lit_rlhf.data import PromptDataModule, TextChunks
    from lit_rlhf.modules import CompressorDecoderModule

    chunks = {"path": opts.text, "context_tokens": opts.context_tokens, "continuation_tokens": 0}
    data = PromptDataModule(
        tokenizer=decoder,
        batch_size=opts.batch_size,
        seed=seed,
        train=TextChunks(**chunks, seed=seed),
        val=TextChunks(**chunks, max_chunks=opts.val_chunks, seed=1000),
    )
    L.seed_everything(seed, verbose=False)
    module = CompressorDecoderModule(
        compressor=compressor,
        decoder=decoder,
        tokenizer=data.tokenizer,
        num_memory_tokens=opts.memory_tokens,
        lr=opts.lr,
        lora_rank=opts.lora_rank,
        dtype=opts.dtype,
        decoder_dtype=opts.dtype,
    )
    trace = LossTrace.make()
    trainer = L.Trainer(
        accelerator=opts.accelerator,
        devices=1,
        max_steps=opts.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[trace],
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    validator = L.Trainer(
        accelerator=opts.accelerator,
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[CompressionDiagnostics(probes=opts.probes, probe_seed=0)],
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--decoder", help="gpu: the frozen decoder (hub id or folder)")
    parser.add_argument("--compressors", nargs="+", help="gpu: compressors, smallest first")
    parser.add_argument(
        "--text", default=str(SAMPLE), help="TextChunks path (file, folder, hub id)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--context-tokens", type=int, default=16)
    parser.add_argument("--memory-tokens", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--val-chunks", type=int, default=64)
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("runs/size_fidelity"))
    opts = parser.parse_args()
    gpu = opts.preset == "gpu"
    opts.accelerator, opts.dtype = ("gpu", "bfloat16") if gpu else ("cpu", "float32")
    opts.out.mkdir(parents=True, exist_ok=True)
    if gpu:
        if not (opts.decoder and opts.compressors):
            parser.error("--preset gpu needs --decoder and --compressors")
        decoder, compressors = opts.decoder, opts.compressors
    else:
        decoder, compressors = cpu_models(opts.out / "models", opts.pretrain_steps)
    results: dict[str, list[dict[str, Any]]] = {}
    for compressor in compressors:
        name = Path(compressor).name
        results[name] = [run_one(compressor, decoder, seed, opts) for seed in opts.seeds]
        print(name, [round(r["seconds"], 1) for r in results[name]], "s", flush=True)
    text = table(results)
    (opts.out / "results.md").write_text(text + "\n")
    (opts.out / "runs.json").write_text(json.dumps(results, indent=1, default=float))
    plot(results, opts.out / "size_fidelity.png")
    print(text)


if __name__ == "__main__":
    main()
