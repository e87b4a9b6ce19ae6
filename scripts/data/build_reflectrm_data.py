"""Build ReflectRM training records (arXiv 2604.07506) from a base judge: sample N judgments per
preference pair, drop the pairs judged correctly in all N, and write the hard pairs (preference
records) and, per hard pair, one correct analysis against one wrong one (reflection records), mixed
4 : 1, as JSONL that ``PreferencePairs(schema="pairs")`` reads.

    # CPU: the embedded SmolLM2 judge on generated copy pairs (verdict-only judgments)
    python scripts/data/build_reflectrm_data.py --model builtin:smollm2-135m-instruct \\
        --synthetic 64 \\
        --task-kind copy --template verdict-short-v1 --tags Result --no-chat-template \\
        --response-prefix " <Result>{subject} 1 is" \\
        --response-suffix " than {subject} 2</Result>" \\
        --max-new-tokens 1 --samples 8 --out runs/reflectrm/records.jsonl
    # GPU: the authors' setting (Qwen3-4B, N = 8, T = 1.0, up to 1024 generated tokens, the
    # no-think switch appended to every question) through vLLM
    python scripts/data/build_reflectrm_data.py --model Qwen/Qwen3-4B --pairs nvidia/HelpSteer3 \\
        --schema helpsteer3 --engine vllm --dtype bfloat16 --samples 8 --max-new-tokens 1024 \\
        --question-suffix " /no_think" --out runs/reflectrm/helpsteer3.jsonl

The judgments are read as training reads them (``lit_rlhf.algos.judge``: a leading think trace
is stripped, text after ``</Result>`` is malformed); ``--question-suffix`` and
``--chat-template-kwargs`` must match the training config's data section.

Train on the output with ``mode: reflectrm`` (``configs/grm/reflectrm_tiny.yaml``,
``configs/grm/reflectrm_qwen3-4b.yaml``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from judge_samples import sampled_texts


def _source(opts: argparse.Namespace) -> Any:
    from lit_rlhf.data import PreferencePairs, SyntheticPairs

    if opts.synthetic:
        return SyntheticPairs(
            num_examples=opts.synthetic, seed=opts.seed, task_kind=opts.task_kind,
            template=opts.template,
        )  # fmt: skip
    return PreferencePairs(
        opts.pairs, schema=opts.schema, split=opts.split, template=opts.template,
        num_examples=opts.num_examples, seed=opts.seed,
    )  # fmt: skip


def _engine(opts: argparse.Namespace) -> Any:
    from lit_rlhf.rollout import HFGenerationEngine

    if opts.engine == "vllm":
        from lit_rlhf.rollout import VLLMGenerationEngine

        return VLLMGenerationEngine(
            max_new_tokens=opts.max_new_tokens, temperature=opts.temperature, seed=opts.seed
        )
    return HFGenerationEngine(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature)


def judge_items(opts: argparse.Namespace) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """The canonical pairs and, per pair, the base judge's N judgments."""
    import torch

    from lit_rlhf.algos.judge import JudgeFormat, analysis_text
    from lit_rlhf.data import PromptDataModule
    from lit_rlhf.data.reflectrm import Judgment
    from lit_rlhf.models import load_causal_lm

    data = PromptDataModule(
        tokenizer=opts.model, train=_source(opts), batch_size=opts.batch_size,
        max_prompt_length=opts.max_prompt_length, response_prefix=opts.response_prefix,
        use_chat_template=not opts.no_chat_template, shuffle=False,
        question_suffix=opts.question_suffix,
        chat_template_kwargs=json.loads(opts.chat_template_kwargs or "{}"),
    )  # fmt: skip
    data.setup("fit")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_causal_lm(opts.model, dtype=opts.dtype).eval().to(device)
    engine, n = _engine(opts), opts.samples
    fmt = JudgeFormat(tuple(opts.tags), "Response", opts.response_prefix, opts.response_suffix)
    items, judgments = [], []
    for batch, per_row in sampled_texts(data, model, engine, n):
        for row, mine in zip(batch["row"], per_row, strict=True):
            items.append(
                {"id": row["family_id"], "prompt": row["query"], "response_1": row["response_1"],
                 "response_2": row["response_2"], "label": row["label"],
                 "subset": row.get("subset") or ""}
            )  # fmt: skip
            judgments.append([Judgment(analysis_text(fmt.text(t)), fmt.verdict(t)) for t in mine])
    return items, judgments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the base judge: hub id, folder, builtin:")
    pairs = parser.add_mutually_exclusive_group(required=True)
    pairs.add_argument("--pairs", help="labelled preference pairs: file, folder or hub id")
    pairs.add_argument("--synthetic", type=int, help="N generated verifiable pairs instead")
    schemas = ["pairs", "helpsteer3", "hh_rlhf", "ultrafeedback", "rewardbench"]
    parser.add_argument("--schema", default="pairs", choices=schemas)
    parser.add_argument("--split", default="train")
    parser.add_argument("--num-examples", type=int, help="use the first N pairs")
    parser.add_argument(
        "--task-kind", default="arithmetic", choices=["arithmetic", "copy", "countdown"]
    )
    parser.add_argument("--template", default="reflectrm-v1")
    parser.add_argument("--tags", nargs="+", default=["Analysis", "Result"])
    parser.add_argument("--response-prefix", default="", help="the assistant pre-fill")
    parser.add_argument("--no-chat-template", action="store_true", help="raw prompts")
    parser.add_argument(
        "--question-suffix", default="", help='appended to each question, e.g. " /no_think"'
    )
    parser.add_argument(
        "--chat-template-kwargs", help='JSON for apply_chat_template: {"enable_thinking": false}'
    )
    parser.add_argument("--response-suffix", default="")
    parser.add_argument("--samples", type=int, default=8, help="judgments per pair (N)")
    parser.add_argument("--ratio", type=int, default=4, help="preference records per reflection")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-prompt-length", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    opts = parser.parse_args(argv)
    if opts.samples < 2:
        parser.error("--samples must be >= 2 (a pair needs a correct and a wrong judgment)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lightning as L

    from lit_rlhf.data.reflectrm import build_reflectrm_records

    L.seed_everything(opts.seed, verbose=False)
    items, judgments = judge_items(opts)
    records, stats = build_reflectrm_records(items, judgments, seed=opts.seed, ratio=opts.ratio)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    print(json.dumps({"out": str(out), **vars(stats)}, indent=1))
    if stats.reflection == 0:
        print(
            "warning: no reflection record (no hard pair had both a correct and a wrong "
            "judgment); raise --samples or --temperature, or use harder pairs",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
