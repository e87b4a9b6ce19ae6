"""The judge-benchmark schemas (RM-Bench, RMB, JudgeBench, PPE-Preference) on the offline
synthetic samples in each benchmark's schema: comparisons per row, labels, ids, subsets, and
malformed rows that fail naming file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlhf.data import PreferencePairs
from lit_rlhf.data.judge_benchmarks import JUDGE_BENCHMARKS, RM_BENCH_STYLES
from lit_rlhf.data.pair_fields import MalformedRow

SAMPLES = Path(__file__).resolve().parents[2] / "lit_rlhf" / "data" / "samples"


def sample(name: str) -> str:
    return str(SAMPLES / f"{name}_synthetic.jsonl")


def sample_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in Path(sample(name)).read_text().splitlines()]


def better(row: dict) -> str:
    """The better response of a labelled pair row."""
    return row["response_1"] if row["label"] == -1 else row["response_2"]


def worse(row: dict) -> str:
    return row["response_2"] if row["label"] == -1 else row["response_1"]


def test_every_benchmark_names_a_schema_and_a_source() -> None:
    for name, bench in JUDGE_BENCHMARKS.items():
        PreferencePairs("unused.jsonl", schema=bench.schema)  # a known schema, or it raises
        assert bench.hub_id or name == "rmb"  # RMB is published on GitHub only


def test_rm_bench_row_is_nine_comparisons_chosen_style_against_rejected_style() -> None:
    source = sample_rows("rm_bench")
    data = PreferencePairs(sample("rm_bench"), schema="rm_bench").load()
    assert len(data) == 3 * 9  # 3 rows x (3 chosen styles x 3 rejected styles)
    rows = {row["family_id"]: row for row in data}
    # the chat and math rows both have id 1: the row id is "{domain}-{id}"
    assert {fid.split("/")[0] for fid in rows} == {"chat-1", "math-1", "safety-refuse-7"}
    for i in range(len(RM_BENCH_STYLES)):
        for j in range(len(RM_BENCH_STYLES)):
            row = rows[f"math-1/c{i}r{j}"]
            assert row["comparison"] == f"c{i}r{j}" and row["subset"] == "math"
            assert better(row) == source[1]["chosen"][i] and worse(row) == source[1]["rejected"][j]
            assert row["query"] == source[1]["prompt"]
    labels = [row["label"] for row in data]
    assert 0 < labels.count(-1) < len(labels)  # chosen placed first or second by a seeded coin


def test_rm_bench_reads_the_authors_json_array_files(tmp_path: Path) -> None:
    path = tmp_path / "chat_filtered.json"  # the authors' per-domain files: no domain field
    rows = [{k: v for k, v in row.items() if k != "domain"} for row in sample_rows("rm_bench")]
    path.write_text(json.dumps(rows[:1], indent=1))
    data = PreferencePairs(str(path), schema="rm_bench", swap="both").load()
    assert len(data) == 18 and set(data["subset"]) == {""}
    assert data["family_id"][0] == "1/c0r0" and data["query_id"][1] == "1/c0r0#swap"


def test_rmb_pairwise_and_best_of_n_rows() -> None:
    pairwise = PreferencePairs(sample("rmb_pairwise"), schema="rmb").load()
    assert pairwise["family_id"] == ["pair_uid:900001", "pair_uid:900002"]
    assert pairwise["subset"] == ["helpfulness-pairwise", "harmlessness-pairwise"]
    assert pairwise["comparison"] == ["", ""]
    source = sample_rows("rmb_pairwise")
    turns = source[1]["conversation_input"]
    assert pairwise[1]["query"] == "\n\n".join(
        f"{t['role'].capitalize()}: {t['content']}" for t in turns
    )
    assert better(pairwise[1]) == source[1]["chosen"]["answer"]
    bon = PreferencePairs(sample("rmb_bon"), schema="rmb").load()
    best = [row["bon_best"]["answer"] for row in sample_rows("rmb_bon")]
    assert bon["family_id"] == [f"bon_uid:900101/loser{k}" for k in range(3)] + [
        f"bon_uid:900102/loser{k}" for k in range(2)
    ]
    assert bon["subset"] == ["helpfulness-bon"] * 3 + ["harmlessness-bon"] * 2
    assert [better(row) for row in bon] == [best[0]] * 3 + [best[1]] * 2
    assert worse(bon[1]) == sample_rows("rmb_bon")[0]["loser_list"][1]["answer"]


def test_judgebench_keeps_the_order_and_maps_sources_to_categories() -> None:
    data = PreferencePairs(sample("judgebench"), schema="judgebench").load()
    source = sample_rows("judgebench")
    assert data["family_id"] == [row["pair_id"] for row in source]
    assert data["label"] == [1, -1, 1, -1]  # B>A, A>B, B>A, A>B
    assert data["response_1"] == [row["response_A"] for row in source]
    assert data["subset"] == ["knowledge", "reasoning", "math", "coding"]


def test_ppe_winner_labels_and_ties() -> None:
    with pytest.warns(UserWarning, match="dropped 1 tied pairs"):
        data = PreferencePairs(sample("ppe_preference"), schema="ppe_preference").load()
    # model_a, model_b, model_a, (tie dropped), model_a
    assert data["label"] == [-1, 1, -1, -1]
    assert data["response_1"][1] == sample_rows("ppe_preference")[1]["response_1"]
    assert all(fid.startswith("judge-") for fid in data["family_id"])  # hashed, not question_id
    kept = PreferencePairs(sample("ppe_preference"), schema="ppe_preference", keep_ties=True)
    assert kept.load()["label"] == [-1, 1, -1, None, -1]


def test_num_examples_keeps_a_benchmark_row_whole() -> None:
    data = PreferencePairs(sample("rm_bench"), schema="rm_bench", num_examples=2).load()
    assert len(data) == 9  # one row: its nine comparisons stay together


def _rm_bench_bad_styles(row: dict) -> None:
    row["chosen"] = row["chosen"][:2]


def _rm_bench_same(row: dict) -> None:
    row["rejected"][1] = row["chosen"][1]


def _rmb_bad_path(row: dict) -> None:
    row["category_path"] = "Helpfulness/Code"


def _rmb_bad_loser(row: dict) -> None:
    row["loser_list"][1] = {"llm_name": "x"}


def _judgebench_tie(row: dict) -> None:
    row["label"] = "A=B"


def _ppe_bad_winner(row: dict) -> None:
    row["winner"] = "model_c"


@pytest.mark.parametrize(
    ("name", "schema", "spoil", "message"),
    [
        ("rm_bench", "rm_bench", _rm_bench_bad_styles, "field 'chosen' must be a list of 3"),
        ("rm_bench", "rm_bench", _rm_bench_same, "field 'rejected' item 1 is identical to"),
        ("rmb_pairwise", "rmb", _rmb_bad_path, "field 'category_path' must start with"),
        ("rmb_bon", "rmb", _rmb_bad_loser, "field 'loser_list' item 1 'answer' must be"),
        ("judgebench", "judgebench", _judgebench_tie, "field 'label' must be 'A>B'"),
        ("ppe_preference", "ppe_preference", _ppe_bad_winner, "field 'winner' must be one of"),
    ],
)
def test_a_malformed_row_fails_naming_file_row_and_field(
    tmp_path: Path, name: str, schema: str, spoil, message: str
) -> None:
    rows = sample_rows(name)
    spoil(rows[1])
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(MalformedRow, match=rf"{name}\.jsonl \(split 'train'\), row 1: {message}"):
        PreferencePairs(str(path), schema=schema).load()
    with pytest.warns(UserWarning, match="skipped 1 malformed rows"):
        kept = PreferencePairs(str(path), schema=schema, skip_malformed=True, keep_ties=True)
        assert len({fid.split("/")[0] for fid in kept.load()["family_id"]}) == len(rows) - 1
