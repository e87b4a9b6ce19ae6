"""Peak activation and logit bytes of one micro-batch, counted from the tensors autograd keeps.

The count follows the decoder-layer accounting of Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198, sec. 4.1: about
``s*b*h*(34 + 5*a*s/h)`` bytes per layer at 16 bits for GPT-style layers with dropout), redone
for the layers this project trains: transformers' Llama / Qwen2 / Qwen3 decoders (pre-RMSNorm,
no dropout, grouped-query attention, a SwiGLU MLP of ``intermediate_size``) and for what
``lit_rlhf`` runs around them (:mod:`lit_rlhf.models.forward`, :mod:`lit_rlhf.models.chunked`,
:mod:`lit_rlhf.algos.entropy`). Every term names the tensor it stands for; nothing is fitted.
The tensors were checked one by one on CPU with ``torch.autograd.graph.saved_tensors_hooks``.

Per token and layer, ``d`` bytes per element of the compute dtype, a trained forward keeps:

- each RMSNorm (two per layer): the float32 copy of its input (``pow`` and the ``rsqrt``
  product save it; for float32 inputs the input itself), the normalised value in ``d`` (the
  weight's product saves it) and the norm's output (the next projections save it):
  ``(4 + 2 * d) * h``, plus the float32 ``rsqrt`` (4 bytes);
- attention: the rotated queries (``hq = heads * head_dim``), the keys and values as the kernel
  sees them (repeated to ``hq`` by ``repeat_kv`` in the padded path, which passes a mask;
  ``kv = kv_heads * head_dim`` otherwise) and the output the output projection saves:
  ``(2 * hq + 2 * kv_eff) * d``; SDPA's fused kernels add a float32 log-sum-exp per head;
  eager attention keeps the float32 softmax over ``kv_len`` keys per head (and its cast to
  ``d`` when ``d`` < 4);
- the SwiGLU MLP: the gate and up projections, ``silu(gate)`` and the product the down
  projection saves: ``4 * intermediate * d``.

Once per forward: the additive attention mask (``[rows, 1, q_len, kv_len]`` in ``d``; the padded
path always passes one), the rotary tables (``cos``, ``sin`` in float32) and the final RMSNorm.
With gradient checkpointing (transformers' ``gradient_checkpointing_enable``, non-reentrant)
each layer keeps only its input (``h * d``) and backward recomputes one layer at a time: every
layer's input plus one full layer. Backward adds a working set: the residual stream's gradient
in and out and the gradients of two ``intermediate``-wide tensors of the layer being
differentiated.

Shared prompts (:func:`lit_rlhf.models.forward._shared_prompt_forward`: the G samples of a
prompt in one micro-batch, no checkpointing): the prompt runs once per distinct prompt, the
responses run with every row's copy of the prompt's keys and values (held by the KV cache), and
autograd holds the response pass's weight gradients in its input buffers until the prompt
pass's backward adds its share: one gradient of the decoder's weights, held while the response
pass's activations are freed. That copy is extra only when the weights' gradients already exist
(``accumulating``: a micro-batch after the first of its optimizer step); otherwise the buffers
become the gradients, which the model states count.

The logits are a separate item (``"logits"``): their size is vocabulary-bound, not layer-bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lit_rlhf.plan.architectures import Architecture

FP32 = 4
LOG_PROB_CHUNK_ROWS = 1024  # rows per chunk of lit_rlhf.algos.entropy (token_log_probs, entropy)


def head_dim(arch: Architecture) -> int:
    return arch.head_dim or arch.hidden_size // arch.num_attention_heads


def _widths(arch: Architecture, repeat_kv: bool) -> tuple[int, int]:
    hq = arch.num_attention_heads * head_dim(arch)
    kv = arch.num_key_value_heads * head_dim(arch)
    return hq, hq if repeat_kv else kv


def layer_saved_bytes_per_token(
    arch: Architecture, *, kv_len: int, d: int, attention: str = "sdpa", repeat_kv: bool = True
) -> int:
    """Bytes one decoder layer keeps for backward, per query token (the module docstring)."""
    h, i, a = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads
    hq, kv_eff = _widths(arch, repeat_kv)
    norms = 2 * ((FP32 + 2 * d) * h + FP32)
    attn = (2 * hq + 2 * kv_eff) * d
    if attention == "eager":
        attn += a * kv_len * (FP32 + (d if d != FP32 else 0))
    else:
        attn += a * FP32  # log-sum-exp of the fused kernel
    return norms + attn + 4 * i * d


def layer_weight_count(arch: Architecture) -> int:
    """Parameters of one decoder layer (projections and norms; biases left out)."""
    h, i = arch.hidden_size, arch.intermediate_size
    hq, kv = _widths(arch, repeat_kv=False)
    return h * (2 * hq + 2 * kv) + 3 * h * i + 2 * h


def backward_working_bytes_per_token(arch: Architecture, *, d: int) -> int:
    """Gradients alive while one layer is differentiated: two of the MLP's width (the product's
    and one projection's) and two of the residual stream's (the incoming and the outgoing)."""
    return (2 * arch.intermediate_size + 2 * arch.hidden_size) * d


def no_grad_layer_bytes_per_token(
    arch: Architecture, *, kv_len: int, d: int, attention: str = "sdpa", repeat_kv: bool = True
) -> int:
    """The transient peak of one layer in a no-grad forward: the residual stream and the
    normalised input (with the norm's float32 copy), plus the larger of the attention block
    (queries, keys and values before and after rotation/repetition, the output) and the MLP
    (three ``intermediate``-wide tensors alive at once)."""
    h, i, a = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads
    hq, kv_eff = _widths(arch, repeat_kv)
    kv = arch.num_key_value_heads * head_dim(arch)
    stream = 2 * h * d + FP32 * h
    attn = (2 * hq + 2 * kv + 2 * kv_eff + hq) * d
    if attention == "eager":
        attn += a * kv_len * (FP32 + (d if d != FP32 else 0))
    return stream + max(attn, 3 * i * d)


def _per_forward(arch: Architecture, rows: int, q_len: int, kv_len: int, d: int) -> int:
    """The attention mask and the rotary tables of one forward."""
    return rows * q_len * kv_len * d + 2 * rows * q_len * head_dim(arch) * FP32


def activation_bytes(
    arch: Architecture,
    *,
    sequences: int,
    seq_len: int,
    compute_dtype_bytes: int,
    gradient_checkpointing: bool,
    trainable: bool = True,
    attention: str = "sdpa",
    packed: bool = False,
    response_len: int = 0,
    shared_prompt_rows: int | None = None,
    accumulating: bool = True,
) -> int:
    """Peak bytes of a decoder's activations for one micro-batch (logits excluded): the policy's
    trunk, or a separate critic's (the value head keeps the final norm's output, counted).

    ``packed``: the rows laid back to back in one row (``micro_batch_tokens``): one
    block-diagonal ``[N, N]`` mask and no key/value repetition. ``shared_prompt_rows``: the
    distinct prompts among the rows when prompts are shared (see the module docstring)."""
    d, b, s, L = compute_dtype_bytes, sequences, seq_len, arch.num_hidden_layers
    tokens = b * s
    rows, length = (1, tokens) if packed else (b, s)
    kw = {"d": d, "attention": attention, "repeat_kv": not packed}
    if not trainable:
        per = no_grad_layer_bytes_per_token(arch, kv_len=length, **kw)  # type: ignore[arg-type]
        return tokens * per + _per_forward(arch, rows, length, length, d)
    final_norm = tokens * ((FP32 + 2 * d) * arch.hidden_size + FP32)
    working = tokens * backward_working_bytes_per_token(arch, d=d)
    u = shared_prompt_rows
    if u is not None and u < b and not gradient_checkpointing and not packed:
        shared = _shared_prompt_bytes(arch, b, u, s, response_len, d, attention, accumulating)
        return shared + working
    layer = tokens * layer_saved_bytes_per_token(arch, kv_len=length, **kw)  # type: ignore[arg-type]
    # checkpointing: every layer's input and one layer recomputed in backward
    kept = L * tokens * arch.hidden_size * d + layer if gradient_checkpointing else L * layer
    return kept + final_norm + working + _per_forward(arch, rows, length, length, d)


def _shared_prompt_bytes(
    arch: Architecture, b: int, u: int, s: int, r: int, d: int, attention: str, accumulating: bool
) -> int:
    """The larger of two moments of the shared-prompt path. When backward starts: the prompt
    pass's kept tensors (``u`` rows of ``p`` tokens) and the response pass's (``b`` rows of ``r``
    tokens attending to ``p + r`` keys: each row's copy of the prompt's keys and values). When the
    response pass's backward ends (its activations freed): the prompt pass's kept tensors, the
    gradients of every layer's ``[b, p + r]`` keys and values (waiting for the prompt's
    backward) and, when ``accumulating``, the response pass's weight gradients (decoder layers
    and the embedding) held in autograd's input buffers until the prompt pass adds its share."""
    p, L, h = s - r, arch.num_hidden_layers, arch.hidden_size
    _, kv_eff = _widths(arch, repeat_kv=True)
    prompt = L * u * p * layer_saved_bytes_per_token(arch, kv_len=p, d=d, attention=attention)
    prompt += _per_forward(arch, u, p, p, d)
    answer = b * r * layer_saved_bytes_per_token(arch, kv_len=s, d=d, attention=attention)
    keys_values = L * 2 * b * s * kv_eff * d
    final_norm = b * r * ((FP32 + 2 * d) * h + FP32)
    start = prompt + L * answer + keys_values + _per_forward(arch, b, r, s, d) + final_norm
    held_grads = (L * layer_weight_count(arch) + arch.vocab_size * h) * d if accumulating else 0
    return max(start, prompt + keys_values + held_grads)


def logits_bytes(
    arch: Architecture,
    *,
    sequences: int,
    response_len: int,
    compute_dtype_bytes: int,
    trainable: bool = True,
    logits_chunk: int | None = None,
) -> int:
    """Peak bytes of the logits of one micro-batch's response positions.

    Padded path (:func:`lit_rlhf.models.forward.forward_response`): the LM head's output over
    ``response_len + 1`` positions and its tempered copy (``[b, R, V]`` in ``d``), which the
    log-prob function keeps; its backward allocates the logits' gradient (``[b, R, V]``) while
    they are still alive, then the temperature's and the slice's gradients replace it. Both
    sides add float32 chunk buffers of ``lit_rlhf.algos.entropy`` (log-softmax and softmax of
    up to 1024 rows): about two ``[b, R+1, V]`` tensors plus the chunk buffers, trained or not.

    Chunked path (``logits_chunk``: :func:`lit_rlhf.models.chunked.packed_response_forward`):
    only one chunk of ``logits_chunk`` response positions exists at a time (recomputed in
    backward): its logits, tempered copy and gradient in ``d`` and the float32 buffers.
    """
    d, v = compute_dtype_bytes, arch.vocab_size
    rows = sequences * response_len
    if logits_chunk is not None:
        c = min(logits_chunk, rows)
        return (3 if trainable else 2) * c * v * d + 2 * c * v * FP32
    c = min(LOG_PROB_CHUNK_ROWS, rows)
    return 2 * sequences * (response_len + 1) * v * d + 2 * c * v * FP32


def micro_batch_peak_bytes(
    arch: Architecture,
    *,
    sequences: int,
    seq_len: int,
    response_len: int,
    compute_dtype_bytes: int,
    gradient_checkpointing: bool,
    trainable: bool = True,
    logits_chunk: int | None = None,
    attention: str = "sdpa",
    shared_prompt_rows: int | None = None,
    accumulating: bool = True,
) -> dict[str, int]:
    """``{"activations": ..., "logits": ...}`` bytes of one micro-batch of ``sequences`` rows
    of ``seq_len`` tokens (prompt + response), ``response_len`` of them scored.

    ``trainable=False``: a no-grad forward (reference, reward, old log-probs). ``logits_chunk``:
    the packed path's LM-head chunk (``lit_rlhf.models.chunked.CHUNK_TOKENS``); None: the padded
    path. ``attention``: ``"sdpa"`` (transformers' default) or ``"eager"``.
    ``shared_prompt_rows``: distinct prompts among the rows when the update shares prompts
    (``forward_response``'s default without checkpointing; None: every row runs in full).
    ``accumulating``: the micro-batch is not the first of its optimizer step (its gradients
    already exist; with shared prompts autograd then buffers a second copy)."""
    for name, value in (("sequences", sequences), ("seq_len", seq_len)):
        if value < 1:
            raise ValueError(f"{name}={value}: a micro-batch needs at least one. Fix: pass >= 1.")
    if not 0 <= response_len <= seq_len:
        raise ValueError(
            f"response_len={response_len} must lie in [0, seq_len={seq_len}]. Fix: pass the "
            "response part of the sequence length."
        )
    if attention not in ("sdpa", "eager"):
        raise ValueError(f"attention={attention!r}. Fix: use 'sdpa' or 'eager'.")
    acts = activation_bytes(
        arch,
        sequences=sequences,
        seq_len=seq_len,
        compute_dtype_bytes=compute_dtype_bytes,
        gradient_checkpointing=gradient_checkpointing,
        trainable=trainable,
        attention=attention,
        packed=logits_chunk is not None,
        response_len=response_len,
        shared_prompt_rows=shared_prompt_rows,
        accumulating=accumulating,
    )
    logits = logits_bytes(
        arch,
        sequences=sequences,
        response_len=response_len,
        compute_dtype_bytes=compute_dtype_bytes,
        trainable=trainable,
        logits_chunk=logits_chunk,
    )
    return {"activations": int(acts), "logits": int(logits)}
