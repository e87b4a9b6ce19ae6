"""TRE saturation drift (docs/exploration.md, "Redesign: saturation drift"; the rule, the gate and
the seed rule are registered there before the first run): once the task is solved, only the
bonus moves the policy; what does each bonus then do to the far tail?

    python scripts/repro/tre_saturation.py --pilot             # seed 0: the gate, pilot figures
    python scripts/repro/tre_saturation.py --seeds 1 2 3 4 5   # after a passed gate
    python scripts/repro/tre_saturation.py --smoke             # tiny random model, plumbing

Per seed: one solve phase (``vanilla`` PPO on Countdown "3 numbers 1-10, +", the TRE CPU
preset's settings, until the training reward is >= 0.95 on 3 consecutive rollout steps, at most
60), checkpointed; then from that checkpoint three drift arms of 40 rollout steps each:
``vanilla``, ``entropy`` (alpha 0.01) and ``tre-k`` (K 2, alpha 0.001). Every phase and arm is
cached under ``--root`` (a stopped run resumes). Writes ``--out`` (default
docs/exploration_saturation.json): per seed the solve phase and every arm's figures, the gate,
the primary over the seeds run, the settings and the commit.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from lightning import Callback

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))

from repro.common import git_commit  # noqa: E402
from repro.intervals import bootstrap_interval  # noqa: E402
from repro.runs import read_rows, series  # noqa: E402
from repro.tre import CPU_DIFFICULTIES, PRESETS, arm_callbacks  # noqa: E402
from repro.tre_runs import arm_fragment, curve_figures, eval_figures, run_cli  # noqa: E402

RULE = {"solved_reward": 0.95, "solved_steps": 3, "solve_max": 60, "drift_steps": 40,
        "alpha": {"entropy": 0.01, "tre-k": 0.001}, "gate_tied": 0.9, "collapse_reward": 0.5,
        "collapse_steps": 3, "end_steps": 5, "min_seeds": 5}  # fmt: skip
ARMS = ("vanilla", "entropy", "tre-k")
STOP = "repro.tre_saturation.StopWhenSolved"


class StopWhenSolved(Callback):
    """Saves ``path`` and stops the fit once the rollout's mean reward has been at least
    ``reward`` on ``steps`` consecutive rollout steps."""

    def __init__(self, path: str, reward: float = 0.95, steps: int = 3) -> None:
        self.path, self.reward, self.steps, self.run = path, reward, steps, 0

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        value = trainer.callback_metrics.get("reward/mean")
        self.run = self.run + 1 if value is not None and float(value) >= self.reward else 0
        if self.run >= self.steps and not trainer.should_stop:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def settings(smoke: bool) -> dict[str, Any]:
    s = copy.deepcopy(PRESETS["smoke" if smoke else "cpu"].settings)
    smoke_rule = {"solve_max": 3, "drift_steps": 2, "solved_reward": -1.0, "solved_steps": 2,
                  "min_seeds": 2}  # fmt: skip
    rule = {**RULE, **smoke_rule} if smoke else RULE
    return {**s, **rule, "difficulty": (CPU_DIFFICULTIES[-1] if smoke else CPU_DIFFICULTIES[0])}


def _fragment(s: dict, root: Path, seed: int, callback: dict | None, batches: int) -> dict:
    """An arm's fragment over one fixed task list (solve plus drift steps' worth, so the solve
    phase and every drift arm see the same shuffled order), ``batches`` rollout steps."""
    fragment = arm_fragment({**s, "steps": s["solve_max"] + s["drift_steps"]},
                            s["difficulty"], root, seed, callback)  # fmt: skip
    fragment["trainer"]["limit_train_batches"] = batches
    return fragment


def solve(s: dict[str, Any], out: Path, seed: int) -> dict[str, Any]:
    """The solve phase (cached): its steps, whether it ended solved, its checkpoint."""
    root = out / f"seed{seed}" / "solve"
    done = root / "solve.json"
    if done.exists():
        cached: dict[str, Any] = json.loads(done.read_text())
        return cached
    ckpt = root / "solved.ckpt"
    stop = {"class_path": STOP, "init_args": {"path": str(ckpt), "reward": s["solved_reward"],
                                              "steps": s["solved_steps"]}}  # fmt: skip
    fragment = _fragment(s, root, seed, None, s["solve_max"])
    fragment["trainer"]["callbacks"].append(stop)
    fragment["trainer"]["limit_val_batches"] = 0
    run_cli("fit", s["configs"], fragment, root / "fragment.yaml")
    rewards = series(read_rows(root / "logs" / "metrics.csv"), "reward/mean")
    figures = {"steps": len(rewards), "solved": ckpt.exists(), "rewards": rewards,
               "checkpoint": str(ckpt)}  # fmt: skip
    done.write_text(json.dumps(figures, indent=1))
    return figures


def drift(s: dict[str, Any], out: Path, seed: int, arm: str, solved: dict) -> dict[str, Any]:
    """One drift arm from the solve checkpoint (cached): the figures of its drift steps."""
    root = out / f"seed{seed}" / arm
    done = root / "figures.json"
    if done.exists():
        cached: dict[str, Any] = json.loads(done.read_text())
        return cached
    callback = arm_callbacks(s["alpha"].get(arm, 0.0))[arm]
    fragment = _fragment(s, root, seed, callback, solved["steps"] + s["drift_steps"])
    fragment["ckpt_path"] = solved["checkpoint"]
    metrics = run_cli("fit", s["configs"], fragment, root / "fragment.yaml")
    rows = read_rows(root / "logs" / "metrics.csv")
    tail = series(rows, "TrustRegionDiagnostics/tail_mass_topp")
    rewards = series(rows, "reward/mean")
    tied = series(rows, "reward/tied_groups")
    run = longest = 0
    for reward in rewards:  # the longest run of rollout steps below the collapse reward
        run = run + 1 if reward < s["collapse_reward"] else 0
        longest = max(longest, run)
    figures = {
        **eval_figures(metrics, s["k"]), **curve_figures(root / "logs" / "metrics.csv"),
        "tail_drift": statistics.fmean(tail[-s["end_steps"]:]) - tail[0] if tail else None,
        "tied_groups": statistics.fmean(tied) if tied else None,
        "collapsed": longest >= s["collapse_steps"], "drift_rewards": rewards,
    }  # fmt: skip
    done.write_text(json.dumps(figures, indent=1))
    return figures


def gate(seed0: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """(a) the solve phase ended solved within ``solve_max``; (b) the vanilla drift arm's groups
    tie on at least ``gate_tied`` of them, on average over the drift steps."""
    tied = seed0["arms"]["vanilla"]["tied_groups"]
    solved = bool(seed0["solve"]["solved"])
    passes = solved and tied is not None and tied >= s["gate_tied"]
    return {"solved": solved, "solve_steps": seed0["solve"]["steps"], "vanilla_tied_groups": tied,
            "threshold": s["gate_tied"], "passes": passes}  # fmt: skip


def primary(seeds: dict[str, dict[str, Any]], min_seeds: int = 2) -> dict[str, Any]:
    """Per seed the far-tail drift, entropy minus TRE-K; from ``min_seeds`` seeds on, the mean
    with its percentile bootstrap, the t-interval beside it and the registered verdict."""
    from repro.intervals import Interval

    diffs = [r["arms"]["entropy"]["tail_drift"] - r["arms"]["tre-k"]["tail_drift"]
             for r in seeds.values()]  # fmt: skip
    if len(diffs) < max(2, min_seeds):
        return {"per_seed": diffs, "verdict": f"none yet: {len(diffs)} of {min_seeds} seeds"}
    boot, t = bootstrap_interval(diffs, -1.0, 1.0), Interval.of(diffs)
    verdict = "reproduced" if boot.low > 0 else "opposite" if boot.high < 0 else "not shown"
    return {"per_seed": diffs, "mean": boot.mean, "bootstrap_95": [boot.low, boot.high],
            "t_95": [t.low, t.high], "verdict": verdict}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pilot", action="store_true", help="seed 0 and the gate only")
    parser.add_argument("--seeds", type=int, nargs="*", default=[])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "reproduce" / "tre-saturation")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "exploration_saturation.json")
    opts = parser.parse_args(argv)
    s = settings(opts.smoke)
    out = opts.root / ("smoke" if opts.smoke else "cpu")
    record: dict[str, Any] = json.loads(opts.out.read_text()) if opts.out.exists() else {}
    runs = record.get("seeds", {})
    for seed in ([0] if opts.pilot else []) + list(opts.seeds):
        solved = solve(s, out, seed)
        arms = {arm: drift(s, out, seed, arm, solved) for arm in ARMS} if solved["solved"] else {}
        runs[str(seed)] = {"solve": solved, "arms": arms}
        drifts = ", ".join(f"{a} tail drift {f['tail_drift']}" for a, f in arms.items())
        print(f"seed {seed}: solve {solved['steps']} steps (solved {solved['solved']}); {drifts}")
    pilot = runs.get("0")
    scored = {k: v for k, v in runs.items() if k != "0" and v["arms"]}
    record = {"settings": {k: v for k, v in s.items() if k != "difficulties"},
              "commit": git_commit(), "seeds": runs,
              "gate": gate(pilot, s) if pilot and pilot["arms"] else (
                  {"passes": False, "solved": False} if pilot else None),
              "primary": primary(scored, s["min_seeds"])}  # fmt: skip
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print("gate:", json.dumps(record["gate"]), "\nprimary:", json.dumps(record["primary"]))
    return record


if __name__ == "__main__":
    main()
