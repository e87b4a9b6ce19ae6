"""Compressor-decoder metrics: hand-checked fidelity scores, accumulation over updates equal to
one update on everything, agreement with the pure functions, and the same values when the
samples are split over two processes."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_rlhf.algos.compression import effective_rank, pooled_effective_rank, token_entropy
from lit_rlhf.metrics import EffectiveRank, MeanTokenEntropy, ReconstructionFidelity
from tests.distributed.launch import run_python

SENTENCE = "The quick brown fox jumps over the lazy dog."
PREDICTIONS = [SENTENCE, "one two three four five", "alpha beta gamma delta", "Mira came home."]
REFERENCES = [SENTENCE, "one two three four six", "north south east west", "Mira came back home."]


def _fidelity(predictions: list[str], references: list[str]) -> dict[str, float]:
    metric = ReconstructionFidelity()
    metric.update(predictions, references)
    return {key: float(value) for key, value in metric.compute().items()}


def test_identical_reconstruction_scores_one_everywhere():
    assert _fidelity([SENTENCE], [SENTENCE]) == pytest.approx(
        {"exact_match": 1.0, "token_f1": 1.0, "rougeL": 1.0, "bleu": 1.0}
    )


def test_disjoint_reconstruction_scores_zero_everywhere():
    scores = _fidelity(["alpha beta gamma delta"], ["north south east west"])
    assert scores == {"exact_match": 0.0, "token_f1": 0.0, "rougeL": 0.0, "bleu": 0.0}


def test_partial_reconstruction_by_hand():
    scores = _fidelity(["one two three four five"], ["one two three four six"])
    # token F1: 4 of 5 tokens shared -> P = R = 4/5 -> F1 = 0.8
    # ROUGE-L: LCS "one two three four" = 4 -> P = R = 4/5 -> F = 0.8
    # BLEU-4: n-gram precisions 4/5, 3/4, 2/3, 1/2; equal lengths -> brevity penalty 1;
    # geometric mean (4/5 * 3/4 * 2/3 * 1/2) ** (1/4) = (1/5) ** (1/4) = 0.6687
    assert scores == pytest.approx(
        {"exact_match": 0.0, "token_f1": 0.8, "rougeL": 0.8, "bleu": 0.2**0.25}, abs=1e-6
    )


def test_rouge_l_subsequence_by_hand():
    scores = _fidelity(["the cat sat on the mat"], ["the cat is on the mat"])
    # LCS "the cat on the mat" = 5 of 6 tokens on each side -> P = R = F = 5/6;
    # token F1: multiset overlap {the: 2, cat, on, mat} = 5 -> 5/6 as well
    assert scores["rougeL"] == pytest.approx(5 / 6, abs=1e-6)
    assert scores["token_f1"] == pytest.approx(5 / 6, abs=1e-6)
    # no 4-gram in common: unsmoothed BLEU-4 is 0 (documented)
    assert scores["bleu"] == 0.0


def test_two_updates_equal_one_update_on_everything():
    split = ReconstructionFidelity()
    split.update(PREDICTIONS[:1], REFERENCES[:1])
    split.update(PREDICTIONS[1:], REFERENCES[1:])
    whole = _fidelity(PREDICTIONS, REFERENCES)
    assert {key: float(value) for key, value in split.compute().items()} == pytest.approx(whole)
    split.reset()
    split.update(PREDICTIONS[2:3], REFERENCES[2:3])
    assert float(split.compute()["token_f1"]) == 0.0  # reset forgot the earlier batches


def test_fidelity_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        ReconstructionFidelity().update(["a", "b"], ["a"])


def test_effective_rank_metric_agrees_with_the_pure_functions():
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randn(3, 4, 8, generator=gen), torch.randn(2, 4, 8, generator=gen)
    metric = EffectiveRank()
    metric.update(first)
    metric.update(second[0])  # a single [k, d] memory counts as one sample
    metric.update(second[1:])
    out = metric.compute()
    everything = torch.cat([first, second])
    torch.testing.assert_close(out["effective_rank"], effective_rank(everything).mean())
    torch.testing.assert_close(out["pooled_effective_rank"], pooled_effective_rank(everything))


def test_effective_rank_pooling_keeps_the_first_max_vectors_rows():
    z = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(1))
    metric = EffectiveRank(max_vectors=6)
    metric.update(z[:1])  # 4 rows kept
    metric.update(z[1:])  # 2 more rows, the rest ignored
    kept = z.reshape(12, 8)[:6]
    torch.testing.assert_close(metric.compute()["pooled_effective_rank"], effective_rank(kept))
    torch.testing.assert_close(metric.compute()["effective_rank"], effective_rank(z).mean())
    with pytest.warns(UserWarning, match="before the ``update``"):
        empty = EffectiveRank().compute()
    assert all(torch.isnan(value) for value in empty.values())
    with pytest.raises(ValueError, match="max_vectors"):
        EffectiveRank(max_vectors=0)


def test_mean_token_entropy_is_token_weighted_over_batches():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 5, 7, generator=gen)
    mask = torch.rand(4, 5, generator=gen) > 0.4
    mask[3] = False  # a sequence with no counted token adds nothing
    metric = MeanTokenEntropy()
    metric.update(logits[:1], mask[:1])
    metric.update(logits[1:], mask[1:])
    expected, _ = token_entropy(logits, mask)
    torch.testing.assert_close(metric.compute(), expected)
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(MeanTokenEntropy().compute())  # no token seen


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        shard = slice(0, 3) if rank == 0 else slice(3, 4)  # uneven: 3 samples and 1
        fidelity = ReconstructionFidelity()
        fidelity.update(PREDICTIONS[shard], REFERENCES[shard])
        values = {key: float(value) for key, value in fidelity.compute().items()}
        z = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(3))[shard]
        erank = EffectiveRank()
        erank.update(z)
        values |= {key: float(value) for key, value in erank.compute().items()}
        torch.save(values, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_metrics_reduce_over_two_processes(tmp_path: Path) -> None:
    run_python("-m", "tests.metrics.test_fidelity", str(tmp_path), timeout=180)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    expected = _fidelity(PREDICTIONS, REFERENCES)
    z = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(3))
    expected |= {
        "effective_rank": float(effective_rank(z).mean()),
        "pooled_effective_rank": float(pooled_effective_rank(z)),
    }
    for result in results:
        assert result == pytest.approx(expected, rel=1e-5)


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(_worker, args=(str(Path(out) / "init"), out), nprocs=2, join=True)
