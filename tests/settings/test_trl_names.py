"""TRL's names, mapped once in lit_rlhf.settings.trl_names: every target is a real setting, the
docs' TRL table agrees with the mapping, and the CLI answers a TRL name and a typo with the
setting meant."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lit_rlhf.cli import cli_main
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.settings import group_params
from lit_rlhf.settings.trl_names import TRL_NAMES

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "ppo" / "countdown_tiny.yaml"


def test_every_target_is_a_setting_of_ppo_or_of_its_engine():
    groups = group_params(PPOModule)
    engine = set(HFGenerationEngine.__init__.__code__.co_varnames)
    for name, (target, _) in TRL_NAMES.items():
        if target.startswith("engine.init_args."):
            assert target.removeprefix("engine.init_args.") in engine, name
            continue
        group, field = target.split(".")
        assert field in {f.name for f in dataclasses.fields(groups[group])}, (name, target)


def test_the_docs_table_says_what_the_mapping_says():
    text = (REPO / "docs" / "algorithms.md").read_text()
    table = text.split("## From TRL's `GRPOConfig` to lit-rlhf", 1)[1].split("\n\n|", 1)[1]
    rows = [r for r in ("|" + table).split("\n\n", 1)[0].splitlines() if r.startswith("| `")]
    seen = set()
    for row in rows:
        trl, ours = row.split(" | ", 1)
        if "` with " in trl:  # a combination of several settings: its own row
            continue
        for name in (n for n in re.findall(r"`([a-z_]+)", trl) if n in TRL_NAMES):
            seen.add(name)
            assert TRL_NAMES[name][0].split(".init_args.")[-1] in ours, (name, row[:120])
    documented = {n for n, (t, _) in TRL_NAMES.items() if not t.startswith("engine.")}
    assert documented - {"learning_rate"} <= seen  # every mapped PPO setting is in the table


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("--model.init_args.num_generations=4",
         "'num_generations' is TRL's name; lit-rlhf's is model.init_args.rollout.samples_per"),
        ("--model.init_args.beta=0.04", "lit-rlhf's is model.init_args.kl.coef (with kl.placement"),
        ("--model.init_args.kl_coeff=0.1", "did you mean kl.coef?"),
        ("--model.init_args.rollot.samples_per_prompt=4",
         "did you mean rollout.samples_per_prompt?"),
    ],
)  # fmt: skip
def test_the_cli_answers_a_trl_name_or_a_typo_with_the_setting_meant(argument, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(CONFIG), argument])
    assert exit_info.value.code != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert expected in last, last
