"""``lit-rlhf export`` of a DeepSpeed checkpoint folder (``pytest -m distributed``): a PPO run on
2 CPU processes under ZeRO-3 (and one process under ZeRO-2) saves its folder
(tests/distributed/run_ppo.py, frozen reference left out), the command joins the partitions with
DeepSpeed's ``zero_to_fp32`` and writes the policy. The folder loads with transformers and holds
exactly the policy weights the run gathered at its end, and answers greedily as a policy with
those weights does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf.cli import main
from lit_rlhf.models import load_causal_lm
from tests.distributed.launch import run_python
from tests.test_export import PPO, greedy

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(("kind", "devices"), [("zero3", 2), ("zero2", 1)])
def test_deepspeed_folder_exports_the_gathered_policy(
    tmp_path: Path, kind: str, devices: int
) -> None:
    folder, weights = tmp_path / kind, tmp_path / "weights"
    run_python(
        "-m", "tests.distributed.run_ppo", kind, str(devices), "1", str(weights),
        "--save-checkpoint", str(folder),
    )  # fmt: skip
    assert (folder / "latest").is_file()  # DeepSpeed's folder, not a file
    out = tmp_path / "hf"
    main(["export", "--config", PPO, f"--ckpt_path={folder}", f"--out={out}"])

    trained = torch.load(f"{weights}.epoch0.rank0.pt", weights_only=True)
    policy = {k.removeprefix("policy."): v for k, v in trained.items() if k.startswith("policy.")}
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    saved = exported.state_dict()
    assert policy and set(policy) <= set(saved)
    for key, value in policy.items():
        torch.testing.assert_close(saved[key], value.float(), atol=1e-6, rtol=0, msg=key)
    start = load_causal_lm("builtin:tiny-llama").state_dict()
    assert any(not torch.equal(start[k], v) for k, v in policy.items())  # the run trained

    reference = load_causal_lm("builtin:tiny-llama")
    reference.load_state_dict(policy, strict=False)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template
    assert greedy(exported, tokenizer) == greedy(reference.eval(), tokenizer)
