"""Measurements on models and tensors that are not RL training: the pathway matrix, the regime
statistics of GEMM operands, the weight components, the correction table and the GPU memory plan."""
