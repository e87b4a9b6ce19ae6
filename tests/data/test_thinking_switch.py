"""Qwen3's thinking switches reach the prompts: ``chat_template_kwargs`` (``enable_thinking:
false``, the ConsistRM presets) and ``question_suffix`` (``" /no_think"``, ReflectRM's), in the
data module and in ``render_chat_prompt`` (which judges use for their own prompts)."""

from __future__ import annotations

from lit_rlhf.data import PromptDataModule, SyntheticPairs
from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.models import load_tokenizer

# the part of Qwen3's chat template that matters here: enable_thinking=false pre-fills an empty
# think block after the assistant header
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_render_chat_prompt_passes_the_template_arguments_and_the_suffix():
    tokenizer = load_tokenizer("builtin:tiny-llama")
    tokenizer.chat_template = QWEN3_LIKE
    thinking = render_chat_prompt(tokenizer, "Which is better?")
    assert thinking == "<|im_start|>user\nWhich is better?<|im_end|>\n<|im_start|>assistant\n"
    off = render_chat_prompt(
        tokenizer, "Which is better?", chat_template_kwargs={"enable_thinking": False}
    )
    assert off == thinking + "<think>\n\n</think>\n\n"
    soft = render_chat_prompt(tokenizer, "Which is better?", question_suffix=" /no_think")
    assert "Which is better? /no_think<|im_end|>" in soft
    # without a chat template the suffix still ends the question, before the pre-fill
    raw = render_chat_prompt(
        tokenizer, "Q", use_chat_template=False, question_suffix=" /no_think", response_prefix="A"
    )
    assert raw == "Q /no_thinkA"


def test_the_data_module_renders_every_prompt_with_the_switches():
    data = PromptDataModule(
        tokenizer="builtin:tiny-llama",
        train=SyntheticPairs(num_examples=2, seed=0, template="consistrm-v1-short"),
        chat_template_kwargs={"enable_thinking": False},
        question_suffix=" /no_think",
        max_prompt_length=4096,
    )
    data.tokenizer.chat_template = QWEN3_LIKE
    data.setup("fit")
    prompts = next(iter(data.train_dataloader()))["prompt"]
    assert len(prompts) == 2
    for prompt in prompts:
        assert prompt.endswith(
            " /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
