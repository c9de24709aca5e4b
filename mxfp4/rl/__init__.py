"""The RL harness: models and patching, GSM8K data, the GRPO trainer, the cell, lm-eval evaluation, pretraining."""


def _transformers_without_torchao() -> None:
    """transformers imports torchao when it is installed (for its TorchAO quantizer) as soon as any
    model class loads: 4.6 s in every cell, pretraining and pathway process. torchao is installed
    here only as the kernel benchmark's peer and no model of the harness is torchao-quantized, so
    RL processes tell transformers it is absent before its quantizers are imported."""
    import transformers.utils as utils
    from transformers.utils import import_utils

    def unavailable(*args, **kwargs) -> bool:
        return False

    utils.is_torchao_available = import_utils.is_torchao_available = unavailable


_transformers_without_torchao()
