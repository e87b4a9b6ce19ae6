"""VLLMGenerationEngine against the HF reference: same greedy tokens and log-probs, tempered
untruncated log-probs, weight sync (and its absence detected), and PPO runs from YAML (one device,
and ZeRO-3 on one process) after which vLLM serves exactly the trained weights.

Runs in the vLLM venv: ``make test-vllm`` (``pytest -m vllm``, VLLM_ENABLE_V1_MULTIPROCESSING=0).
One vLLM instance serves the module (each start costs 10-20 s on 2 cores); tests that change the
policy's weights leave it synced for the next.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_rlhf.cli import cli_main
from lit_rlhf.models import TinyModelSpec, load_causal_lm, load_tokenizer, write_tiny_model
from lit_rlhf.models.forward import forward_response
from lit_rlhf.rollout import HFGenerationEngine, VLLMGenerationEngine

# none of the imports above imports vllm; in-process vLLM needs this before it starts
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

# fp32 on both sides; measured max |delta| is ~5e-7 (greedy) and ~1.5e-6 (sampled, T=0.7)
LOGPROB_TOL = 1e-4
MAX_NEW = 12
PROMPTS = ["hello there", "Using the numbers [1, 2]", "The quick brown fox", "What is 15 + 27?"]
CONFIG = Path(__file__).parents[2] / "configs" / "ppo" / "countdown_tiny_vllm.yaml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama with head size 32 (vLLM's minimum) whose greedy output for the first prompt
    hits EOS: the EOS embedding row is a scaled copy of the row of the token greedy picks first,
    so with the tied head EOS out-scores it (a random network almost never emits EOS)."""
    path = tmp_path_factory.mktemp("llama_h32")
    spec = TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    write_tiny_model(path, spec)
    tokenizer, model = load_tokenizer(str(path)), load_causal_lm(str(path))
    enc = tokenizer(PROMPTS[:1], return_tensors="pt")
    with torch.no_grad():
        first = int(model(**enc).logits[0, -1].argmax())
        emb = model.get_input_embeddings().weight
        emb[tokenizer.eos_token_id] = 1.5 * emb[first]
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def policy(model_dir):
    return load_causal_lm(model_dir)


@pytest.fixture(scope="module")
def engine():
    return VLLMGenerationEngine(
        max_new_tokens=MAX_NEW,
        temperature=0.7,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        push_bucket_bytes=1 << 20,  # ~580 KiB per decoder block: a push takes several calls
    )


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenizer(PROMPTS, return_tensors="pt", padding=True)  # left-padded


def forward_log_probs(policy, batch, out, temperature):
    """Log-probs of the engine's tokens under the HF policy (the contract, computed directly)."""
    ids = torch.cat([batch.input_ids, out.response_ids], 1)
    mask = torch.cat([batch.attention_mask.bool(), out.response_mask], 1)
    with torch.no_grad():
        fwd = forward_response(policy, ids, mask, out.response_ids, temperature=temperature)
    return fwd.log_probs


def max_diff(a, b, mask):
    return float((a - b)[mask].abs().max())


def hf_greedy(policy, batch, tokenizer, max_new_tokens=MAX_NEW):
    hf = HFGenerationEngine(max_new_tokens=max_new_tokens)
    return hf.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)


def test_importing_the_package_does_not_import_vllm():
    code = "import sys, lit_rlhf.rollout, lit_rlhf.cli; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_greedy_tokens_and_log_probs_match_hf(engine, policy, tokenizer, batch):
    ref = hf_greedy(policy, batch, tokenizer)
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert torch.equal(out.response_mask, ref.response_mask)
    assert max_diff(out.log_probs, ref.log_probs, out.response_mask) < LOGPROB_TOL
    # EOS handling: row 0 stops at EOS (kept, mask True), then pad with mask False
    assert out.response_ids[0, 0] == tokenizer.eos_token_id
    assert out.response_mask[0].tolist() == [True] + [False] * (out.response_ids.shape[1] - 1)
    assert (out.response_ids[0, 1:] == tokenizer.pad_token_id).all()
    assert (out.log_probs[~out.response_mask] == 0).all()
    assert out.response_mask[1:].all()  # the others run to max_new_tokens
    assert out.response_ids.shape[1] == MAX_NEW


def test_sampled_log_probs_are_tempered_and_untruncated(engine, policy, tokenizer, batch):
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer)
    ref = forward_log_probs(policy, batch, out, engine.temperature)
    assert max_diff(out.log_probs, ref, out.response_mask) < LOGPROB_TOL
    # with top-k/top-p on, vLLM's own log-probs are renormalised over the kept tokens; the engine
    # must still return the untruncated ones
    engine.top_k, engine.top_p = 5, 0.9
    try:
        out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer)
    finally:
        engine.top_k, engine.top_p = 0, 1.0
    ref = forward_log_probs(policy, batch, out, engine.temperature)
    assert max_diff(out.log_probs, ref, out.response_mask) < LOGPROB_TOL


def test_sampling_follows_torchs_generator_so_a_resume_samples_the_same(
    engine, policy, tokenizer, batch
):
    """Each sampled request's seed comes from torch's global generator (in every checkpoint):
    the same generator state gives the same responses, whatever vLLM's engine generator did in
    between; the next draw gives other responses."""

    def sample():
        return engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer)

    torch.manual_seed(123)
    first, second = sample(), sample()
    torch.manual_seed(123)
    again = sample()
    assert torch.equal(first.response_ids, again.response_ids)
    torch.testing.assert_close(first.log_probs, again.log_probs, rtol=0, atol=0)
    assert not torch.equal(first.response_ids, second.response_ids)


def optimizer_step(policy, batch):
    """One AdamW step on the prompts' language-model loss: every tensor moves."""
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    loss = policy(**batch, labels=batch.input_ids.masked_fill(batch.attention_mask == 0, -100)).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_sync_weights_serves_the_updated_policy_and_skipping_it_is_detected(
    engine, policy, tokenizer, batch
):
    before = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    optimizer_step(policy, batch)
    ref = hf_greedy(policy, batch, tokenizer)

    # no sync: vLLM still serves the old weights, and the comparison sees it
    stale = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert torch.equal(stale.response_ids, before.response_ids)
    assert max_diff(stale.log_probs, before.log_probs, stale.response_mask) < LOGPROB_TOL
    updated = forward_log_probs(policy, batch, stale, 1.0)
    assert max_diff(stale.log_probs, updated, stale.response_mask) > 1e-2

    engine.sync_weights(policy)
    n_params = len(list(policy.parameters()))
    assert engine.last_sync_tensors == n_params  # full fine-tuning: every tensor, no diff
    assert engine.last_sync_buckets > 1 and engine.snapshot.tensors == {}  # several calls
    fresh = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert torch.equal(fresh.response_ids, ref.response_ids)
    assert max_diff(fresh.log_probs, ref.log_probs, fresh.response_mask) < LOGPROB_TOL


def test_the_reference_push_sends_only_what_changed(engine, policy, tokenizer, batch):
    """``push_bucket_bytes=0``: the per-parameter push against a full copy, in one call."""
    engine.push_bucket_bytes = 0
    try:
        engine.sync_weights(policy)  # the copy is made: everything sent once more
        assert engine.last_sync_tensors == len(list(policy.parameters()))
        engine.sync_weights(policy)
        assert engine.last_sync_tensors == 0  # nothing changed since
        optimizer_step(policy, batch)
        engine.sync_weights(policy)
        assert (engine.last_sync_tensors, engine.last_sync_buckets) == (
            len(engine.snapshot.tensors),
            1,
        )
        out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
        ref = hf_greedy(policy, batch, tokenizer)
        assert torch.equal(out.response_ids, ref.response_ids)
        assert max_diff(out.log_probs, ref.log_probs, out.response_mask) < LOGPROB_TOL
    finally:
        engine.push_bucket_bytes = 1 << 20


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        # 9 tensors in a decoder block: q, k, v (one fused vLLM layer), o, gate, up, down, 2 norms
        ("model.layers.1.self_attn.k_proj.weight", 9),
        # the embedding alone: vLLM's tied head must be re-processed too (it packs its weight)
        ("model.embed_tokens.weight", 1),
        ("model.norm.weight", 1),
    ],
)
def test_partial_sync_of_one_tensor(engine, policy, tokenizer, batch, name, sent):
    # a frozen weight: not a full update, so the bucketed push tests what changed
    frozen = policy.get_parameter("model.layers.0.input_layernorm.weight").requires_grad_(False)
    try:
        engine.sync_weights(policy)  # the copy is made (everything sent)
        with torch.no_grad():
            param = policy.get_parameter(name)
            param.add_(torch.randn_like(param) * 0.2)
        engine.sync_weights(policy)
    finally:
        frozen.requires_grad_(True)
    ref = hf_greedy(policy, batch, tokenizer)
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert max_diff(out.log_probs, ref.log_probs, out.response_mask) < LOGPROB_TOL
    assert torch.equal(out.response_ids, ref.response_ids)
    assert engine.last_sync_tensors == sent


def test_close_then_generate_starts_a_new_instance_with_every_weight_pushed(
    engine, policy, tokenizer, batch
):
    engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    engine.close()
    assert engine.llm is None
    # the new instance loads the folder's (original) weights; earlier tests moved the policy, and
    # the push after start must send all of it, not the diff against the closed instance
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert engine.last_sync_tensors == len(list(policy.parameters()))
    ref = hf_greedy(policy, batch, tokenizer)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert max_diff(out.log_probs, ref.log_probs, out.response_mask) < LOGPROB_TOL


def test_a_per_call_token_budget_cuts_that_call_only(engine, policy, tokenizer, batch):
    full = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    short = engine.generate(
        policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True, max_new_tokens=4
    )
    width = short.response_ids.shape[1]
    assert width <= 4 and full.response_ids.shape[1] > 4
    assert torch.equal(short.response_ids, full.response_ids[:, :width])


def test_without_log_probs_the_tokens_are_the_same(engine, policy, tokenizer, batch):
    args = (policy, batch.input_ids, batch.attention_mask, tokenizer)
    with_lp = engine.generate(*args, greedy=True)
    without = engine.generate(*args, greedy=True, log_probs=False)
    assert with_lp.log_probs is not None and without.log_probs is None
    assert torch.equal(with_lp.response_ids, without.response_ids)
    assert torch.equal(with_lp.response_mask, without.response_mask)


def test_sleep_mode_is_refused_on_cpu(policy):
    engine = VLLMGenerationEngine(enable_sleep_mode=True)
    with pytest.raises(ValueError, match="not supported on CPU"):
        engine._create(policy)


ZERO3 = ["--config", str(CONFIG.parents[1] / "trainer" / "cpu_deepspeed_zero3.yaml")]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="single-device"),
        # ZeRO-3 on one process: the sync gathers each sharded parameter before comparing it
        pytest.param([*ZERO3, "--trainer.devices=1"], id="zero3"),
    ],
)
def test_ppo_fast_dev_run_from_yaml(tmp_path, extra):
    if extra:
        pytest.importorskip("deepspeed")
    cli = cli_main(
        [
            "fit",
            "--config",
            str(CONFIG),
            *extra,
            "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}",
            # a random policy scores 0 on Countdown: zero advantages, so AdamW would not move
            # the weights and there would be nothing to sync; digits vary in random text
            "--model.init_args.reward=lit_rlhf.rewards.DigitFractionReward",
            "--model.init_args.eval.pass_metric=null",  # that reward has no `correct` info
        ]
    )
    assert cli.trainer.state.finished
    assert cli.model.rollout_step == 1
    engine, policy, tokenizer = cli.model.engine, cli.model.policy, cli.model.tokenizer
    assert isinstance(engine, VLLMGenerationEngine)
    assert hasattr(next(policy.parameters()), "ds_id") == bool(extra)  # sharded under ZeRO-3
    assert engine.last_sync_tensors == len(list(policy.parameters()))  # the last step was pushed
    # mismatch_correction auto: vLLM's log-probs are corrected by TIS, and the gap is logged
    assert cli.model.rl.mismatch == "tis"
    logged = cli.trainer.logged_metrics
    for key in ("abs_log_ratio", "kl", "ratio_max", "ratio_min", "capped_fraction"):
        assert f"rollout/mismatch_{key}" in logged, key
    assert float(logged["rollout/mismatch_abs_log_ratio"]) < LOGPROB_TOL  # fp32 on both sides
    # what vLLM serves after training is the trained policy
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ref = hf_greedy(policy, batch, tokenizer, engine.max_new_tokens)
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert torch.equal(out.response_ids, ref.response_ids)
    assert max_diff(out.log_probs, ref.log_probs, out.response_mask) < LOGPROB_TOL
