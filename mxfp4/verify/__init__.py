"""Checking code: the Triton kernels against the reference bit for bit, the decomposition identity over
the standard distributions, adversarial inputs, and the device audit of a quantizer."""
