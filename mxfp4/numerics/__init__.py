"""Numerics: block formats, the reference quantizer, the exact error decomposition, the recipe's
quantizer, and the Triton kernels behind one dispatch. No RL dependency."""
