"""The RL harness: models, GSM8K data, the GRPO trainer, the cell, lm-eval evaluation, pretraining."""
