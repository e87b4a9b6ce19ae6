"""Peak activation and logit bytes of one micro-batch, counted from the tensors autograd keeps.

The count follows the decoder-layer accounting of Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198, sec. 4.1: about
``s*b*h*(34 + 5*a*s/h)`` bytes per layer at 16 bits for GPT-style layers with dropout), redone
for the layers this project trains: transformers' Llama / Qwen2 / Qwen3 decoders (pre-RMSNorm,
no dropout, grouped-query attention, a SwiGLU MLP of ``intermediate_size``) and for what
``lit_rlhf`` runs around them (:mod:`lit_rlhf.models.forward`, :mod:`lit_rlhf.models.chunked`,
:mod:`lit_rlhf.algos.entropy`). Every term names the tensor it stands for; nothing is fitted.

Per token and layer, ``d`` bytes per element of the compute dtype, a trained forward keeps:

- each RMSNorm (two per layer): the float32 copy of its input (``pow`` and ``mul`` save it;
  for float32 inputs the input itself) and the normalised output in ``d`` (the weight's
  ``mul`` saves it): ``(4 + d) * h`` each;
- attention: the rotated queries (``hq = heads * head_dim``), the keys and values as the
  attention kernel sees them (repeated to ``hq`` by ``repeat_kv`` when a padding mask is given,
  as in the padded path; ``kv = kv_heads * head_dim`` otherwise), the kernel's output and the
  contiguous copy the output projection saves: ``(3 * hq + 2 * kv_eff) * d``; eager attention
  also keeps the float32 softmax (and its cast to ``d`` when ``d`` < 4): ``heads * s * (4 [+ d])``;
  SDPA's fused kernels keep a float32 log-sum-exp per head (``4 * heads``);
- the SwiGLU MLP: the gate and up projections, ``silu(gate)`` and the product the down
  projection saves: ``4 * intermediate * d``.

Once per forward: the boolean attention mask ``[b, 1, s, s]`` (float in ``d`` for eager
attention) and the final RMSNorm. With gradient checkpointing (transformers'
``gradient_checkpointing_enable``, non-reentrant) each layer keeps only its input (``h * d``)
and backward recomputes one layer at a time, so the peak is every layer's input plus one full
layer. Backward adds a working set on top of what is kept: the residual-stream gradient and the
gradients of the largest intermediates of the layer being differentiated (two of
``intermediate`` width, two of ``h``).

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


def layer_saved_bytes_per_token(
    arch: Architecture, *, seq_len: int, d: int, attention: str = "sdpa", repeat_kv: bool = True
) -> int:
    """Bytes one decoder layer keeps for backward, per token (see the module docstring)."""
    h, i, a = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads
    hq = a * head_dim(arch)
    kv = arch.num_key_value_heads * head_dim(arch)
    kv_eff = hq if repeat_kv else kv
    norms = 2 * (FP32 + d) * h
    attn = (3 * hq + 2 * kv_eff) * d
    if attention == "eager":
        attn += a * seq_len * (FP32 + (d if d != FP32 else 0))
    else:
        attn += a * FP32  # log-sum-exp of the fused kernel
    mlp = 4 * i * d
    return norms + attn + mlp


def backward_working_bytes_per_token(arch: Architecture, *, d: int) -> int:
    """Gradients alive while one layer is differentiated: two of the MLP's width (the product's
    and one projection's) and two of the residual stream's (the incoming and the outgoing)."""
    return (2 * arch.intermediate_size + 2 * arch.hidden_size) * d


def no_grad_layer_bytes_per_token(
    arch: Architecture, *, seq_len: int, d: int, attention: str = "sdpa", repeat_kv: bool = True
) -> int:
    """The transient peak of one layer in a no-grad forward: the residual stream and the
    normalised input, plus the larger of the attention block (queries, keys and values before
    and after rotation/repetition, the output) and the MLP (three ``intermediate``-wide
    tensors alive at once: gate, up and ``silu(gate)``, or ``silu(gate)``, up and the
    product)."""
    h, i, a = arch.hidden_size, arch.intermediate_size, arch.num_attention_heads
    hq = a * head_dim(arch)
    kv = arch.num_key_value_heads * head_dim(arch)
    kv_eff = hq if repeat_kv else kv
    stream = 2 * h * d + FP32 * h  # residual, normalised output, the norm's float32 copy
    attn = (2 * hq + 2 * kv + 2 * kv_eff + hq) * d
    if attention == "eager":
        attn += a * seq_len * (FP32 + (d if d != FP32 else 0))
    return stream + max(attn, 3 * i * d)


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
) -> int:
    """Peak bytes of the decoder's activations for one micro-batch (logits excluded).

    ``packed``: the rows are laid back to back in one row (``micro_batch_tokens``); the mask is
    then one ``[N, N]`` block-diagonal matrix and keys/values are not repeated."""
    d, b, s, L = compute_dtype_bytes, sequences, seq_len, arch.num_hidden_layers
    tokens = b * s
    mask_rows = 1 if packed else b
    mask_len = tokens if packed else s
    mask = mask_rows * mask_len * mask_len * (d if attention == "eager" else 1)
    kw = {"seq_len": mask_len, "d": d, "attention": attention, "repeat_kv": not packed}
    if not trainable:
        return tokens * no_grad_layer_bytes_per_token(arch, **kw) + mask  # type: ignore[arg-type]
    layer = tokens * layer_saved_bytes_per_token(arch, **kw)  # type: ignore[arg-type]
    final_norm = tokens * (FP32 + d) * arch.hidden_size
    working = tokens * backward_working_bytes_per_token(arch, d=d)
    # checkpointing: every layer's input and one layer recomputed in backward
    kept = L * tokens * arch.hidden_size * d + layer if gradient_checkpointing else L * layer
    return kept + final_norm + working + mask


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
    up to 1024 rows). Trained: about two ``[b, R+1, V]`` tensors plus the chunk buffers.
    No-grad: the head's output and the tempered copy plus the chunk buffers.

    Chunked path (``logits_chunk``: :func:`lit_rlhf.models.chunked.packed_response_forward`):
    only one chunk of ``logits_chunk`` response positions exists at a time (recomputed in
    backward): its logits, tempered copy and gradient in ``d`` and the float32 buffers.
    """
    d, v = compute_dtype_bytes, arch.vocab_size
    rows = sequences * response_len
    if logits_chunk is not None:
        c = min(logits_chunk, rows)
        chunk_f32 = 2 * c * v * FP32
        return (3 if trainable else 2) * c * v * d + chunk_f32
    c = min(LOG_PROB_CHUNK_ROWS, rows)
    chunk_f32 = 2 * c * v * FP32
    full = sequences * (response_len + 1) * v * d
    return 2 * full + chunk_f32


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
) -> dict[str, int]:
    """``{"activations": ..., "logits": ...}`` bytes of one micro-batch of ``sequences`` rows
    of ``seq_len`` tokens (prompt + response), ``response_len`` of them scored.

    ``trainable=False``: a no-grad forward (reference, reward, old log-probs). ``logits_chunk``:
    the packed path's LM-head chunk (``lit_rlhf.models.chunked.CHUNK_TOKENS``); None: the padded
    path. ``attention``: ``"sdpa"`` (transformers' default) or ``"eager"``."""
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
