"""The ConsistRM ``cpu-varied`` preset's pieces (scripts/repro/judge_varied.py, the gate in
scripts/repro/consistrm.py, the preset on reproduce.py's command line): every SFT target reads
with the shipped judge parser, the checked ones to the gold label and the lazy one to the first
position; the proportions the design rests on; the gate's two parts; the warm judge's cache key.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from repro import consistrm  # noqa: E402
from repro import judge_common as jc  # noqa: E402
from repro import judge_varied as jv  # noqa: E402
from repro.common import Paper, docs_json  # noqa: E402

from lit_rlhf.algos.judge import JudgeFormat  # noqa: E402

SETTINGS = consistrm.PRESETS["cpu-varied"].settings


def test_every_target_parses_checked_ones_to_gold_and_lazy_ones_to_response_1() -> None:
    pools = jc.make_pools(SETTINGS["pools"], seed=0, max_value=SETTINGS["max_value"])
    pairs = pools["warm"]
    rows = jc.warm_rows(pairs, SETTINGS)
    assert len(rows) == len(pairs) * 2 * (SETTINGS["lazy_copies"] + len(jv.FORMS))
    fmt = JudgeFormat(jc.TAGS)
    lazy = [r for r in rows if jv.LAZY in r["response"]]
    assert len(lazy) * 3 == len(rows)  # one judgment in three
    assert {fmt.verdict(r["response"]) for r in lazy} == {-1}
    for pair in pairs:
        for swapped in (False, True):
            gold = pair.label * (-1 if swapped else 1)
            for form in range(len(jv.FORMS)):
                text = jv.checked_judgment(pair, form, swapped=swapped)
                assert fmt.verdict(text) == gold, text
                assert str(pair.right) in text and pair.expr in text


def test_the_openings_differ_so_the_checked_mass_is_spread() -> None:
    pair = jc.ArithPair("p", 7, "+", 5, 13, right_first=False)
    openings = [jv.lazy_judgment()] + [jv.checked_judgment(pair, f) for f in range(4)]
    first_words = [t.removeprefix("<Analysis>").split()[0] for t in openings]
    assert len(set(first_words)) == 5, first_words  # At, Response, 7, Checking:, Values:
    counts = Counter(
        r["response"].removeprefix("<Analysis>").split()[0]
        for r in jv.varied_rows([pair], lazy_copies=2, seed=0)
    )
    assert counts["At"] == 4 and max(c for w, c in counts.items() if w != "At") == 2


def test_no_lazy_copy_is_refused_and_an_unknown_style_is_named() -> None:
    with pytest.raises(ValueError, match="judge_style: checked"):
        jv.varied_rows([], lazy_copies=0, seed=0)
    with pytest.raises(ValueError, match="'checked', 'varied'"):
        jc.warm_rows([], {**SETTINGS, "judge_style": "lazy"})


@pytest.mark.parametrize(
    ("majority", "greedy", "pseudo", "sample", "go"),
    [
        (0.60, 0.55, 0.70, 0.65, True),  # both margins exactly at 0.05
        (0.59, 0.55, 0.80, 0.60, False),  # the majority beats greedy by 0.04 only
        (0.90, 0.50, 0.74, 0.70, False),  # the pseudo-labels beat one sample by 0.04 only
        (0.40, 0.60, 0.90, 0.50, False),
    ],
)
def test_the_registered_gate_needs_both_parts(majority, greedy, pseudo, sample, go) -> None:
    figures = {"pool_majority_accuracy": majority, "pool_greedy_accuracy": greedy,
               "pseudo_label_accuracy": pseudo, "pool_random_sample_accuracy": sample}  # fmt: skip
    assert consistrm.gate_passes(figures, SETTINGS["gate"]) is go
    # the cpu preset's rule (no registered gate): the majority beats greedy, by any margin
    assert consistrm.gate_passes(figures, None) is (majority > greedy)


def test_the_warm_judge_key_covers_the_style_and_keeps_the_cpu_presets(tmp_path: Path) -> None:
    cpu = consistrm.PRESETS["cpu"].settings
    out = tmp_path / "reproduce" / "consistrm"
    varied = jc.warm_dir(out / "cpu-varied", SETTINGS)
    assert varied != jc.warm_dir(out / "cpu", cpu)
    assert varied != jc.warm_dir(out / "cpu-varied", {**SETTINGS, "lazy_copies": 3})
    # the cpu preset's key has no style in it: its cached judge stays valid
    assert jc.warm_dir(out / "cpu", cpu) == jc.warm_dir(
        out / "cpu", {**cpu, "judge_style": "checked"}
    )


def test_reproduce_takes_the_papers_own_preset_and_names_its_record(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = [sys.executable, str(ROOT / "scripts" / "reproduce.py"), "consistrm"]
    shown = subprocess.run([*run, "--preset", "cpu-varied", "--print-settings"],
                           capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert shown.returncode == 0 and '"judge_style": "varied"' in shown.stdout
    import reproduce  # the refusals in this process (a subprocess each cost 5 s)

    with pytest.raises(SystemExit) as refused:
        reproduce.main(["consistrm", "--preset", "cpu-fast", "--print-settings"])
    assert "no preset 'cpu-fast'" in str(refused.value) and "cpu-varied" in str(refused.value)
    with pytest.raises(SystemExit) as forced:
        reproduce.main(["consistrm", "--preset", "cpu-varied", "--force", "--print-settings"])
    assert "without --force" in str(forced.value)
    reproduce.main(["consistrm", "--preset", "cpu", "--force", "--print-settings"])
    out = capsys.readouterr().out  # the cpu preset kept its --force
    assert '"sft_steps"' in out and '"varied"' not in out
    paper: Paper = consistrm.PAPER
    assert docs_json(paper, Path("docs"), "cpu-varied") == Path(
        "docs/grm_consistrm_cpu_varied.json"
    )
    assert docs_json(paper, Path("docs"), "cpu") == Path("docs/grm_consistrm.json")


def test_the_gpu_window_preset_runs_its_path_on_cpu_at_smoke_scale(tmp_path: Path) -> None:
    """The gpu-window preset's own settings (fact rows, accelerator auto, in-process) with the
    model and sizes shrunk: the warm start writes the arithmetic rows beside the varied
    judgments, the gate decides, and a trained arm's run reads back. On CPU: plumbing only."""
    import yaml
    from repro.common import Context, Preset, cached_precheck, cached_run

    window = consistrm.PRESETS["gpu-window"].settings
    assert window["accelerator"] == "auto" and window["fact_copies"] > 0
    tiny = {**window, "model": "builtin:tiny-llama", "pools": {"warm": 4, "unlabelled": 2,
            "eval": 2}, "sft_steps": 1, "fact_copies": 1, "samples": 2, "max_new_tokens": 6,
            "full_judgments": False, "samples_per_prompt": 2, "batch_size": 4,
            "val_batch_size": 4, "eval_batch_size": 4, "micro_batch_size": 8, "epochs": 1,
            "probe_steps": 1}  # fmt: skip
    ctx = Context("consistrm", Preset("gpu-window", (0,), 1, tiny), tmp_path / "gpu-window")
    precheck = cached_precheck(consistrm.PAPER, ctx)
    assert isinstance(precheck["go"], bool) and "vs a random sample" in precheck["reason"]
    sft = (jc.warm_dir(ctx.out, tiny) / "warm-start.jsonl").read_text().splitlines()
    facts = [line for line in sft if '"prompt": "What is' in line]
    assert len(facts) == 9 * 9 * 2 and len(sft) - len(facts) == 4 * 2 * 6
    assert '"response": "3 - 7 = -4"' in "".join(facts)
    figures = cached_run(consistrm.PAPER, ctx, "consistrm", 0)
    assert 0.0 <= figures["accuracy"] <= 1.0 and len(figures["rows"]) == 4
    config = yaml.safe_load((ctx.out / "consistrm" / "seed0" / "config.yaml").read_text())
    assert config["trainer"]["accelerator"] == "auto"


def test_judged_rows_are_reused_until_the_judge_the_pool_or_an_option_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"query_id": "q0"}\n')
    calls: list[tuple[str, dict]] = []
    row = jc.Judged("f0", 1, None, (1, None, -1), 1, 0, "q0")

    def fake(model: str, pairs_path: Path, **kw: object) -> list[jc.Judged]:
        calls.append((model, dict(kw)))
        return [row]

    monkeypatch.setattr(jc, "judge_pool", fake)
    cache = tmp_path / "judged" / "unlabelled-seed0.json"
    first = jc.judge_pool_cached(cache, "judge-a", pool, samples=3, seed=0)
    again = jc.judge_pool_cached(cache, "judge-a", pool, samples=3, seed=0)
    assert first == again == [row] and len(calls) == 1  # None votes and tuples survive JSON
    jc.judge_pool_cached(cache, "judge-b", pool, samples=3, seed=0)
    jc.judge_pool_cached(cache, "judge-b", pool, samples=3, seed=1)
    pool.write_text('{"query_id": "q1"}\n')
    jc.judge_pool_cached(cache, "judge-b", pool, samples=3, seed=1)
    assert [c[0] for c in calls] == ["judge-a", "judge-b", "judge-b", "judge-b"]
    assert calls[2][1] == {"samples": 3, "seed": 1}
    assert not cache.with_suffix(".partial").exists()
