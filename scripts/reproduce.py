"""Rerun one paper's comparison with one command: a pre-check that decides whether the mechanism
can show at this scale, then every (arm, seed), cached, then a table with 95 % intervals, a PNG
and a JSON of every figure.

    python scripts/reproduce.py tre --preset cpu                 # 3 seeds, about 60 min alone
    python scripts/reproduce.py mgs --preset cpu --seeds 0 1 2 3
    python scripts/reproduce.py consistrm --precheck-only
    python scripts/reproduce.py compression --preset gpu --print-settings
    python scripts/reproduce.py reflectrm --smoke                 # tiny models, under a minute

Results go to ``<out>/<paper>/<preset>/`` (default ``runs/reproduce``): ``precheck.json``,
``<arm>/seed<k>/result.json`` (one per finished run: a stopped preset resumes where it stopped;
a cache made with other settings is refused unless ``--fresh``), ``results.md``, ``results.json``
and ``<paper>.png``; for the cpu / gpu presets ``results.json`` (per-seed values, per-row
judge outputs, settings, fingerprint, commit) is also copied to ``docs/<page>_<paper>.json``
(``--docs``). Each paper's page in docs/ states its primary metric, expected direction and
the rule for "reproduced" (the 95 % interval of the paired arm difference excludes 0 on the
expected side).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from repro.common import Context, Paper, cached_precheck, cached_run, choose_preset, write_outputs

# paper -> (module under scripts/repro/, one line for --help)
PAPERS: dict[str, tuple[str, str]] = {
    "tre": ("repro.tre", "trust-region entropy vs a global entropy bonus on Countdown (tail mass)"),
    "mgs": ("repro.mgs", "per-module vs global PCGrad on three live domains (conflict fractions)"),
    "consistrm": ("repro.consistrm", "label-free ConsistRM vs RFT from a warm judge"),
    "reflectrm": ("repro.reflectrm", "greedy vs majority vs reflective inference of a warm judge"),
    "compression": ("repro.compression", "compressor size vs probe overwriting and drift"),
}


def load_paper(name: str) -> Paper:
    module = importlib.import_module(PAPERS[name][0])
    paper: Paper = module.PAPER
    return paper


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    listing = "\n".join(f"  {name:<12} {line}" for name, (_, line) in PAPERS.items())
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog=f"papers:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paper", choices=list(PAPERS))
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--preset", default="cpu", help="cpu (default), gpu, or a paper's own")
    scale.add_argument("--smoke", action="store_true", help="tiny models, seconds per run")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the preset's")
    parser.add_argument("--arms", nargs="+", help="default: every arm of the paper")
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="results.json copied here")
    parser.add_argument("--fresh", action="store_true", help="delete this preset's cache first")
    parser.add_argument("--precheck-only", action="store_true")
    parser.add_argument(
        "--force", action="store_true", help="run the arms even when the pre-check says no"
    )
    parser.add_argument(
        "--print-settings", action="store_true", help="print the preset's settings and exit"
    )
    opts = parser.parse_args(argv)
    opts.preset = "smoke" if opts.smoke else opts.preset
    opts.docs = None if opts.smoke else opts.docs  # a smoke run writes nowhere in docs/
    return opts


def main(argv: Sequence[str] | None = None) -> dict[str, object] | None:
    opts = parse_args(argv)
    paper = load_paper(opts.paper)
    preset = choose_preset(paper, opts)
    if opts.print_settings:
        print(json.dumps({"preset": preset.name, "seeds": preset.seeds, **preset.settings},
                         indent=1, default=str))  # fmt: skip
        return None
    out = opts.out / paper.name / preset.name
    if opts.fresh and out.exists():
        shutil.rmtree(out)
    ctx = Context(paper.name, preset, out)
    precheck = cached_precheck(paper, ctx)
    ctx.log(f"pre-check: go={precheck['go']} ({precheck['reason']})")
    if opts.precheck_only:
        return {"precheck": precheck}
    if not precheck["go"] and not opts.force:
        ctx.log("pre-check says the arms cannot show the mechanism; --force runs them anyway")
        write_outputs(paper, ctx, {}, precheck, docs=opts.docs)
        return {"precheck": precheck}
    seeds = tuple(opts.seeds) if opts.seeds is not None else preset.seeds
    arms = tuple(opts.arms) if opts.arms else paper.arms
    runs = {arm: {seed: cached_run(paper, ctx, arm, seed) for seed in seeds} for arm in arms}
    summary = write_outputs(paper, ctx, runs, precheck, docs=opts.docs)
    print((out / "results.md").read_text())
    ctx.log(f"wrote {out}/results.md, results.json, {paper.name}.png")
    return {"precheck": precheck, "summary": summary}


if __name__ == "__main__":
    main()
