"""Adversarial inputs shared by the reference tests and the kernel checks: [rows, K] float32 (K = 96 by default)."""

from __future__ import annotations

import torch

E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def adversarial_rows(k: int = 96, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = 8
    cases = {}
    cases["gaussian"] = torch.randn(n, k, generator=g)
    # exact E2M1 ties times the block scale (block max 6 * 2^k pins the scale at 2^k)
    ties = torch.tensor(E2M1_TIES)[torch.randint(0, len(E2M1_TIES), (n, k), generator=g)]
    ties = ties * (torch.randint(0, 2, (n, k), generator=g) * 2 - 1)
    ties[:, ::32] = 6.0
    cases["ties"] = ties * 2.0 ** torch.randint(-20, 20, (n, 1), generator=g).float()
    # ties of the ideal scale s* = amax / 6 where it is no power of two: each block's max is 6c * 2^j,
    # its other elements exact midpoints of the grid times c * 2^j (c random, 4 significant bits)
    blocks = -(-k // 32)
    c = (
        (8 + torch.randint(0, 8, (n, blocks), generator=g))
        / 8
        * 2.0 ** torch.randint(-20, 20, (n, blocks), generator=g)
    )
    c = c.repeat_interleave(32, dim=1)[:, :k]
    ideal = torch.tensor(E2M1_TIES)[torch.randint(0, len(E2M1_TIES), (n, k), generator=g)]
    ideal = ideal * (torch.randint(0, 2, (n, k), generator=g) * 2 - 1) * c
    ideal[:, ::32] = 6.0 * c[:, ::32]
    cases["ideal_ties"] = ideal
    # saturation: the block max sits just under the next power of two (floor rule gives amax/s ~ 8)
    sat = torch.randn(n, k, generator=g)
    sat[:, ::32] = 7.99
    cases["saturation"] = sat
    cases["tiny"] = torch.randn(n, k, generator=g) * 2.0**-133  # float32 subnormals, scale clamps
    cases["subnormal_out"] = torch.randn(n, k, generator=g) * 2.0**-125  # decoded values are subnormal
    cases["huge"] = torch.randn(n, k, generator=g) * 2.0**125
    zeros = torch.randn(n, k, generator=g)
    zeros[:, :32] = 0.0
    zeros[1] = 0.0
    cases["zero_blocks"] = zeros
    special = torch.randn(n, k, generator=g)
    special[0, 3] = float("nan")
    special[1, 40] = float("inf")
    special[2, 70] = float("-inf")
    special[3, 5] = -0.0
    cases["nan_inf"] = special
    cases["negative_zero"] = -torch.rand(n, k, generator=g) * 0.01 + torch.where(torch.arange(k) % 32 == 0, 1.0, 0.0)
    return cases
