"""CompressionDiagnostics with a plain LightningModule (not one of ours) that returns fixed
memory, logits and texts from ``validation_step`` and serves the probes with ``reconstruct``:
the logged values equal the pure functions' values over everything validated."""

from __future__ import annotations

import re
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.algos.compression import effective_rank, exact_match, token_entropy, token_f1
from lit_rlhf.algos.compression import pooled_effective_rank as pooled_erank
from lit_rlhf.callbacks import CompressionDiagnostics
from lit_rlhf.data.probes import make_probes, probe_rates
from lit_rlhf.metrics.fidelity import ReconstructionFidelity
from tests.helpers import quiet_trainer

B, K, D, T, V = 3, 4, 8, 5, 7  # batch, memory tokens, width, target tokens, vocabulary
PROBES, SEED = 6, 3
REFERENCES = [["the cat sat on the mat", "a quick brown fox", "hello world"],
              ["one two three", "Alice thanked Bob.", "x y z"]]  # fmt: skip
RECONSTRUCTIONS = [["the cat sat on the mat", "a quick red fox jumps", ""],
                   ["One, two three!", "Bob thanked Alice.", "q"]]  # fmt: skip
ALL_REFERENCES = [text for batch in REFERENCES for text in batch]
ALL_RECONSTRUCTIONS = [text for batch in RECONSTRUCTIONS for text in batch]


def edited(item: dict[str, Any]) -> str:
    """The item's context with the probed fact overwritten or drifted, from the item's fields."""
    text, kind = item["context"], item["kind"]

    def swap(a: str, b: str) -> str:
        words = {a: b, b: a}
        return re.sub(rf"\b({re.escape(a)}|{re.escape(b)})\b", lambda m: words[m[1]], text)

    if kind == "overwrite":
        return re.sub(rf"\b{item['fact']}\b", item["prior"], text)
    if kind == "role":
        return swap(item["agent"], item["patient"])
    if kind == "order":
        return swap(item["first"], item["second"])
    was = f"was not {item['predicate']}" if item["negated"] else f"was {item['predicate']}"
    now = f"was {item['predicate']}" if item["negated"] else f"was not {item['predicate']}"
    return text.replace(was, now)


class FixedReconstructor(L.LightningModule):
    """Not one of ours: returns fixed tensors and strings per validation batch, and answers the
    probes with each context unchanged (even positions) or edited (odd positions)."""

    def __init__(self, none_at: int | None = None) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.memory = torch.randn(2, B, K, D, generator=g)
        self.memory[1, 0, 1] = self.memory[1, 0, 0]  # a repeated row lowers one sample's erank
        self.logits = torch.randn(2, B, T, V, generator=g) * 3
        self.mask = torch.rand(2, B, T, generator=g) > 0.3
        self.none_at = none_at
        self.items = make_probes("overwrite", PROBES, seed=SEED)
        self.items += make_probes("drift", PROBES, seed=SEED)
        self.reconstruct_calls = 0

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, Any] | None:
        if batch_idx == self.none_at:
            return None
        return {"memory": self.memory[batch_idx], "logits": self.logits[batch_idx],
                "logits_mask": self.mask[batch_idx], "references": REFERENCES[batch_idx],
                "reconstructions": RECONSTRUCTIONS[batch_idx]}  # fmt: skip

    def reconstruct(self, texts: list[str]) -> list[str]:
        self.reconstruct_calls += 1
        by_context = {item["context"]: (i, item) for i, item in enumerate(self.items)}
        return [text if by_context[text][0] % 2 == 0 else edited(by_context[text][1])
                for text in texts]  # fmt: skip


def validate(module: L.LightningModule, callback: CompressionDiagnostics, tmp_path: Any) -> dict:
    trainer = quiet_trainer(tmp_path, callbacks=[callback])
    trainer.validate(module, DataLoader(list(range(2)), batch_size=1), verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_logged_values_equal_the_pure_functions_over_all_batches(tmp_path: Any) -> None:
    module = FixedReconstructor()
    logged = validate(module, CompressionDiagnostics(probes=PROBES, probe_seed=SEED), tmp_path)
    memory = module.memory.flatten(0, 1)  # [2 * B, K, D]: both batches
    assert logged["val/effective_rank"] == pytest.approx(float(effective_rank(memory).mean()))
    assert logged["val/pooled_effective_rank"] == pytest.approx(float(pooled_erank(memory)))
    entropy, _ = token_entropy(module.logits.flatten(0, 1), module.mask.flatten(0, 1))
    assert logged["val/decoder_entropy"] == pytest.approx(float(entropy))  # token-weighted
    pairs = list(zip(ALL_RECONSTRUCTIONS, ALL_REFERENCES, strict=True))
    # exact after normalisation: "the cat sat on the mat" and "One, two three!"; 2 of 6
    assert logged["val/exact_match"] == pytest.approx(2 / 6)
    assert logged["val/exact_match"] == pytest.approx(sum(exact_match(p, r) for p, r in pairs) / 6)
    assert logged["val/token_f1"] == pytest.approx(sum(token_f1(p, r) for p, r in pairs) / 6)
    at_once = ReconstructionFidelity()  # one batch holding all six pairs
    at_once.update(ALL_RECONSTRUCTIONS, ALL_REFERENCES)
    for key, value in at_once.compute().items():
        assert logged[f"val/{key}"] == pytest.approx(float(value)), key
    # probes: half kept, half overwritten or drifted, in every kind (3 kinds x 2 items of 6
    # drift items, each kind at one even and one odd position)
    texts = module.reconstruct([item["context"] for item in module.items])
    rates = probe_rates(module.items, texts)
    assert rates["overwrite/kept"] == rates["overwrite/overwritten"] == 0.5
    assert all(rates[f"{kind}/kept"] == rates[f"{kind}/drifted"] == 0.5
               for kind in ("role", "negation", "order"))  # fmt: skip
    assert {k: logged[f"val/probe/{k}"] for k in rates} == pytest.approx(rates)


def test_a_validation_step_returning_none_is_ignored(tmp_path: Any) -> None:
    logged = validate(FixedReconstructor(none_at=1), CompressionDiagnostics(probes=0), tmp_path)
    module = FixedReconstructor()  # the first batch alone
    assert logged["val/effective_rank"] == pytest.approx(
        float(effective_rank(module.memory[0]).mean())
    )
    assert logged["val/exact_match"] == pytest.approx(1 / 3)  # only "the cat sat on the mat"


def test_no_probes_logs_no_probe_keys_and_never_reconstructs(tmp_path: Any) -> None:
    module = FixedReconstructor()
    logged = validate(module, CompressionDiagnostics(probes=0), tmp_path)
    assert "val/effective_rank" in logged
    assert not [k for k in logged if "probe" in k] and module.reconstruct_calls == 0


def test_a_negative_number_of_probes_is_refused() -> None:
    with pytest.raises(ValueError, match="probes must be >= 0"):
        CompressionDiagnostics(probes=-1)
