"""tests/recipes.py: the docs/recipes.md parser and the check that holds a config to its table."""

from __future__ import annotations

import pytest
import yaml

from tests.recipes import (
    RECIPES,
    check_citations,
    check_table,
    citation,
    load_recipes,
    lookup,
    missing_vllm_rows,
    parse_recipes,
    uses_vllm,
    values_equal,
)

REPO = RECIPES.parents[1]

DOC = """# Recipes
intro text | with a bar that is not a table

### configs/ppo/demo.yaml + configs/trainer/deepspeed_zero2.yaml

| setting | authors | source | ours | deviation |
|---|---|---|---|---|
| `model.init_args.lr` | `1.0e-6` | run script | `1e-6` | |
| `model.init_args.max_new_tokens` | `8192` | run script | `1024` | memory on one GPU |
| `trainer.callbacks[TrustRegionEntropy].init_args.k` | `2` | paper | `2` | |
| `data.init_args.sources[1].path` | `b` | script | `b` | |
| script:compare.py --seeds | `3` | paper | `1` | time |

### configs/rm/other.yaml

| setting | authors | source | ours | deviation |
|---|---|---|---|---|
| `model.init_args.schedule` | not given | paper | `constant` | the authors fix none; ours |

## Next paper
| `model.init_args.lr` | `1` | x | `2` | not a table of a preset |
"""

CONFIG = {
    "trainer": {
        "callbacks": [
            {"class_path": "a.b.MetricsPlot", "init_args": {}},
            {"class_path": "lit_rlhf.callbacks.TrustRegionEntropy", "init_args": {"k": 2}},
        ]
    },
    "model": {"init_args": {"lr": 1.0e-6, "max_new_tokens": 1024}},
    "data": {"init_args": {"sources": [{"path": "a"}, {"path": "b"}]}},
}


def test_parse_reads_headings_fragments_and_rows():
    tables = parse_recipes(DOC)
    assert sorted(tables) == ["configs/ppo/demo.yaml", "configs/rm/other.yaml"]
    demo = tables["configs/ppo/demo.yaml"]
    assert demo.fragment == "configs/trainer/deepspeed_zero2.yaml"
    assert [r.setting for r in demo.rows][:2] == [
        "model.init_args.lr",
        "model.init_args.max_new_tokens",
    ]
    assert demo.rows[0].authors == 1.0e-6 and demo.rows[1].ours == 1024
    assert demo.rows[1].deviation == "memory on one GPU"
    assert not demo.rows[4].is_config  # script:... is not read
    other = tables["configs/rm/other.yaml"]
    assert other.fragment is None and len(other.rows) == 1  # the row after "## Next" is not its
    assert not other.rows[0].authors_is_value and other.rows[0].authors == "not given"


def test_matching_config_passes_with_listed_deviation():
    tables = parse_recipes(DOC)
    assert check_table(tables["configs/ppo/demo.yaml"], CONFIG) == []


def test_unlisted_mismatch_fails():
    doc = DOC.replace("| `1024` | memory on one GPU |", "| `1024` | |")
    problems = check_table(parse_recipes(doc)["configs/ppo/demo.yaml"], CONFIG)
    assert len(problems) == 1 and "no deviation reason" in problems[0]
    assert "max_new_tokens" in problems[0]


def test_config_differing_from_ours_fails():
    config = {**CONFIG, "model": {"init_args": {"lr": 2.0e-6, "max_new_tokens": 1024}}}
    problems = check_table(parse_recipes(DOC)["configs/ppo/demo.yaml"], config)
    assert len(problems) == 1 and "holds 2e-06" in problems[0]


def test_missing_path_fails():
    config = {**CONFIG, "trainer": {"callbacks": []}}
    problems = check_table(parse_recipes(DOC)["configs/ppo/demo.yaml"], config)
    assert len(problems) == 1 and "TrustRegionEntropy" in problems[0]
    assert "not in the composed config" in problems[0]


def test_prose_authors_cell_needs_a_reason():
    doc = DOC.replace("| the authors fix none; ours |", "| |")
    config = {"model": {"init_args": {"schedule": "constant"}}}
    problems = check_table(parse_recipes(doc)["configs/rm/other.yaml"], config)
    assert len(problems) == 1 and "no deviation reason" in problems[0]


def test_lookup_selectors():
    assert lookup(CONFIG, "trainer.callbacks[TrustRegionEntropy].init_args.k") == 2
    assert lookup(CONFIG, "trainer.callbacks[0].class_path") == "a.b.MetricsPlot"
    with pytest.raises(KeyError, match="no 'nope'"):
        lookup(CONFIG, "model.init_args.nope")
    with pytest.raises(KeyError, match="0 entries of class KLCov"):
        lookup(CONFIG, "trainer.callbacks[KLCov].init_args.k")
    with pytest.raises(KeyError, match=r"has 2 entries, no \[5\]"):
        lookup(CONFIG, "trainer.callbacks[5]")


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1.0e-6, 1e-6 * (1 + 1e-12), True),
        (1.0e-6, 1.01e-6, False),
        (2, 2.0, True),
        (True, 1, False),
        (None, None, True),
        (None, 0, False),
        ([3, 4], [3.0, 4.0], True),
        ([3, 4], [3], False),
        ("topk", "topk", True),
        ({"a": 1}, {"a": 1.0}, True),
    ],
)
def test_values_equal(a, b, equal):
    assert values_equal(a, b) is equal


def test_duplicate_table_is_refused():
    with pytest.raises(ValueError, match="two tables"):
        parse_recipes("### configs/a.yaml\n\n### configs/a.yaml\n")


def test_short_row_is_refused():
    with pytest.raises(ValueError, match="needs 5 cells"):
        parse_recipes("### configs/a.yaml\n| `x` | `1` | src |\n")


def test_the_shipped_doc_parses():
    parse_recipes(RECIPES.read_text())  # no malformed row or duplicate table


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("S experiments/countdown/1.5b_ppo.sh:38 `rollout.n`", "file"),
        ("V verl/trainer/config/ppo_trainer.yaml:49,191 `grad_clip`", "file"),
        ("vLLM's `max_seq_len=4992` in the authors' log nohup.out:704", "file"),
        ("P §4.1 (AdamW)", "paper"),
        ("P[ICAE] §3.1 (the Pile)", "paper"),
        ("P Table 2", "paper"),
        ("P eq. 13", "paper"),
        ("P abstract", "paper"),
        ("unverified: 68bed1ae is not fetchable here", "unverified"),
        ("S `rollout.n`", None),  # a key without a line
        ("paper", None),
        ("sec. 4.1", None),
        ("run script and paper", None),
        ("unverified:", None),  # no reason
        ("the ratio 4:1", None),
        ("GPU 8 x A100", None),
    ],
)
def test_citation_forms(source, kind):
    assert citation(source) == kind


def test_a_row_without_a_citation_is_reported():
    doc = DOC.replace("| `2` | paper | `2` |", "| `2` | P §2 | `2` |")
    tables = parse_recipes(doc)
    problems = check_citations(tables)
    assert [p.split("`")[1] for p in problems] == [  # every row but the one citing P §2
        "model.init_args.lr",
        "model.init_args.max_new_tokens",
        "data.init_args.sources[1].path",
        "script:compare.py --seeds",
        "model.init_args.schedule",
    ]
    assert all("cites no `path:line`" in p for p in problems)


def test_every_shipped_row_cites_its_source():
    """Every authors' cell of docs/recipes.md cites a file and line at the section's commit, a
    paper's section / table / equation, or says ``unverified: <why>`` (no import skip here)."""
    tables = load_recipes()
    rows = [row for table in tables.values() for row in table.rows]
    assert len(tables) >= 16 and len(rows) >= 600
    assert check_citations(tables) == []
    kinds = {row.citation for row in rows}
    assert kinds == {"file", "paper", "unverified"}


def test_every_vllm_preset_tables_the_settings_a_cpu_dry_run_cannot_exercise():
    """Rollout dtype, tensor parallel size, engine, world size (devices per node, nodes), sleep
    mode and where the weight sync's snapshot lives."""
    checked = []
    for name, table in load_recipes().items():
        if uses_vllm(yaml.safe_load((REPO / name).read_text())):
            assert missing_vllm_rows(table) == [], name
            checked.append(name)
    assert len(checked) >= 12, checked  # the TRE, MGS, GRM, DAPO, GSPO and calculator presets
    bare = parse_recipes("### configs/a.yaml\n| `trainer.devices` | `8` | P §1 | `8` | |\n")
    assert missing_vllm_rows(bare["configs/a.yaml"]) == [
        "engine",
        "rollout dtype",
        "tensor parallel size",
        "nodes",
        "sleep mode",
        "weight-sync snapshot",
    ]
