"""scripts/repro/compression_gpu.py, the compression GPU window, at smoke scale on the CPU: the
decoder LM is trained inside the command on a corpus whose priors we set, then the size
comparison runs on it; the record is written after each seed, and a spent budget stops it."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import compression_gpu as cg
from repro.compression_planted import subject_values


def test_the_corpus_gives_each_subject_its_prior_at_the_set_share() -> None:
    texts = cg.corpus(4000, 0.9)
    values = subject_values()
    from lit_rlhf.data.probes import make_probes

    items = make_probes("overwrite", 4000, seed=cg.CORPUS_SEED)
    said = Counter()
    for text, item in zip(texts, items, strict=True):
        value = text.rsplit(" ", 1)[1].rstrip(".")
        assert value in values[item["subject"]]  # the prior or one of its counterfactuals
        said[value == item["prior"]] += 1
    assert 0.88 < said[True] / len(texts) < 0.92


def test_the_smoke_window_trains_the_lm_and_records_every_seed(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    args = ["--regime", "smoke", "--work", str(tmp_path / "work"), "--out", str(out)]
    record = cg.main(args)
    assert (tmp_path / "work" / "smoke" / "lm" / "config.json").exists()  # the LM trained here
    assert record["lm"]["cached"] is False and record["lm"]["seconds"] > 0
    saved = json.loads(out.read_text())
    assert saved["seeds"].keys() == {"0"}
    assert set(saved["seeds"]["0"]["final"]) == set(cg.REGIMES["smoke"]["sizes"])
    assert saved["primary"]["verdict"].startswith("not testable at this scale")
    assert saved["settings"]["decoder"] == str(tmp_path / "work" / "smoke" / "lm")
    spent = cg.main([*args, "--budget", "0"])  # no seed starts; the LM is cached
    assert spent["lm"]["cached"] and spent["primary"]["verdict"] == "none yet: 0 of 1 seeds"
