"""ConsistRM refuses to train from an empty memory unless ``unseeded: true`` says so (issue 36,
N6): the authors seed it with 8 votes of the starting judge per query."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_rlhf.callbacks import ConsistencyAnswerReward

REPO = Path(__file__).parents[2]
REFUSAL = r"no initial_memory: .* Fix: set initial_memory to .*, or unseeded: true"


def test_a_fit_without_a_seed_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=REFUSAL) as err:
        ConsistencyAnswerReward().setup(None, None, "fit")
    assert "\n" not in str(err.value)  # one line


def test_unseeded_a_seed_or_no_memory_starts(tmp_path):
    seed = tmp_path / "seed.jsonl"
    seed.write_text('{"query_id": "q0", "labels": [1, -1, 1]}\n')
    seeded = ConsistencyAnswerReward(initial_memory=str(seed))
    seeded.setup(None, None, "fit")
    assert seeded.memory == {"q0": [1, -1, 1]}
    unseeded = ConsistencyAnswerReward(unseeded=True)
    unseeded.setup(None, None, "fit")
    assert unseeded.memory == {}
    ConsistencyAnswerReward(use_memory=False).setup(None, None, "fit")  # the ablation: no memory
    ConsistencyAnswerReward().setup(None, None, "validate")  # no reward outside training


def test_the_cli_refuses_the_tiny_config_without_unseeded(tmp_path):
    """From the outside: ``lit-rlhf fit`` on the tiny ConsistRM config with ``unseeded`` removed
    exits with the one-line refusal, before any step."""
    config = yaml.safe_load((REPO / "configs" / "grm" / "consistrm_tiny.yaml").read_text())
    answer = config["trainer"]["callbacks"][0]
    assert answer["class_path"].endswith("ConsistencyAnswerReward")
    assert answer["init_args"].pop("unseeded") is True  # the shipped demo runs unseeded
    config["trainer"].update(default_root_dir=str(tmp_path), logger=False)
    path = tmp_path / "consistrm_seedless.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode != 0
    assert "ConsistencyAnswerReward has no initial_memory" in run.stderr, run.stderr[-2000:]
    assert "unseeded: true" in run.stderr
