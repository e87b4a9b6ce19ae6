"""``load_causal_lm(num_layers=...)``: a depth-truncated pretrained model keeps the first layers,
the embeddings, the final norm and the LM head of the checkpoint, and computes what the full
model's first layers compute."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.models import load_causal_lm

TINY = "builtin:tiny-llama"  # 2 layers


def test_truncated_model_keeps_the_checkpoints_first_layers_and_head() -> None:
    full, cut = load_causal_lm(TINY), load_causal_lm(TINY, num_layers=1)
    assert cut.config.num_hidden_layers == 1 and len(cut.model.layers) == 1
    full_params = dict(full.named_parameters())
    for name, param in cut.named_parameters():
        assert torch.equal(param, full_params[name]), name
    # the full model's hidden_states[1] is layer 0's output; the cut model's last hidden state
    # is that output through the final norm, and its logits the head over it
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        full_out = full(input_ids=ids, output_hidden_states=True)
        cut_out = cut(input_ids=ids, output_hidden_states=True)
        normed = full.model.norm(full_out.hidden_states[1])
        torch.testing.assert_close(cut_out.hidden_states[-1], normed)
        torch.testing.assert_close(cut_out.logits, full.lm_head(normed))
    assert not torch.allclose(cut_out.logits, full_out.logits)  # layer 1 did change them


@pytest.mark.parametrize("layers", [0, 3, True])
def test_a_depth_outside_the_model_is_refused(layers: int) -> None:
    with pytest.raises(ValueError, match=r"has 2 layers\. Fix: a depth from 1 to 2"):
        load_causal_lm(TINY, num_layers=layers)
