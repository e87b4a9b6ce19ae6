"""lit-rlhf: Lightning-native RL fine-tuning of language models."""

__version__ = "0.1.0"
