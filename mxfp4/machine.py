"""The CPU numerics a run depends on: pinned before torch loads, recorded with every result.

Float results on a CPU depend on the instruction set the libraries pick at run time (ATen's vectorised
kernels, MKL's BLAS, oneDNN), so the same seed can give other numbers on another x86-64 machine.
``pin_cpu_numerics`` sets the three libraries to AVX2, which every x86-64 server and desktop of the
last decade has (ATen's ``ATEN_CPU_CAPABILITY``, MKL's conditional numerical reproducibility branch
``MKL_CBWR``, oneDNN's ``ONEDNN_MAX_CPU_ISA``); it must run before torch is imported (the Snakefile and
the ``mxfp4`` command do so). The pins do not make CPUs of two vendors agree: MKL takes other paths on
each (the embedded profile's tiny-moe cells stored from an AMD EPYC differ on an Intel Xeon), which is
why ``compare`` reruns stored cells before it uses them. ``MXFP4_CPU_ISA=native`` leaves the libraries
to choose. ``describe`` says what is in force, for ``metrics.json``. This module imports no torch at
import time.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# MKL's strict reproducible mode: a GEMM's sums no longer depend on its operands' padding, layout or
# alignment, which MKL's AVX2 branch lets change the last bit on an Intel Xeon (a grouped GEMM over
# zero-padded segments then differs from the per-segment GEMMs). It also gives other sums than that branch,
# so the workflow keeps PINNED, with which its stored baselines were made; the test suite, whose tests hold
# two GEMM structures equal bit for bit, asks for it.
STRICT_GEMM = {"MKL_CBWR": "AVX2,STRICT"}
OPT_OUT = "MXFP4_CPU_ISA"  # "native": no pinning


def pin_cpu_numerics(strict_gemm: bool = False) -> bool:
    """Pin ATen, MKL and oneDNN to AVX2 unless the user set them or opted out (``MXFP4_CPU_ISA=native``),
    on x86-64 only; ``strict_gemm``: MKL in its strict mode (``STRICT_GEMM``). True when the pins are in
    force for the torch this process will load; False when torch was already imported (too late: nothing
    is changed) or pinning does not apply."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    mode = os.environ.get(OPT_OUT, "avx2")
    if mode not in ("avx2", "native"):
        raise ValueError(f"{OPT_OUT}={mode!r}; accepted: avx2 (the default: pin ATen, MKL and oneDNN) or native")
    if mode == "native" or "torch" in sys.modules:
        return False
    pins = PINNED | (STRICT_GEMM if strict_gemm else {})
    for key, value in pins.items():
        os.environ.setdefault(key, value)
    return all(os.environ[k] == v for k, v in pins.items())


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` line of /proc/cpuinfo (Linux), or None."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return None
    return next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith(field)), None)


def cpu_flags() -> list[str]:
    """The vector extensions the CPU offers (from /proc/cpuinfo), of those the libraries dispatch on."""
    flags = (_cpuinfo("flags") or "").split()
    return [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]


def describe() -> dict:
    """The machine and the CPU numerics in force in this process (torch loaded)."""
    import torch

    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split() if part.startswith("BLAS_INFO=")),
                None)
    return {
        "cpu": _cpuinfo("model name") or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "threads": torch.get_num_threads(),
        "pinning": {k: os.environ.get(k) for k in PINNED} | {OPT_OUT: os.environ.get(OPT_OUT)},
    }
