"""The RL harness: models and patching, GSM8K data, the GRPO trainer, the cell, lm-eval evaluation, pretraining."""
