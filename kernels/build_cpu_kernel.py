"""Build the fused C++ CPU quantizer once, before any job that quantizes, and say how it went (JSON).

The kernel is compiled on first use and cached on disk for every later process (``mxfp4.numerics.fused_cpu``,
about 50 s on 2 cores). Without this step the first two quantizing jobs of a run meet it together: one
compiles while the other waits on the build's lock with its core idle. As a job of its own it runs beside
the warm starts' SFT, which does not quantize.

    python kernels/build_cpu_kernel.py --out results/embedded/kernels/cpu_kernel.json
"""

from __future__ import annotations

import argparse
import sys
import time

from mxfp4.machine import describe, pin_cpu_numerics

pin_cpu_numerics()  # before torch loads, as in every job that uses the kernel

from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.numerics import dispatch, fused_cpu  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    start = time.perf_counter()
    backend = dispatch.prepare("mxfp4")
    seconds = time.perf_counter() - start
    report = {"backend": backend, "built": fused_cpu.available(), "seconds": seconds,
              "method": "wall time of mxfp4.numerics.dispatch.prepare (compiles where the disk cache is stale)",
              "machine": describe()}
    write_json_atomic(args.out, report)
    print(f"CPU backend {backend} ready in {seconds:.1f} s" + ("" if report["built"] else
                                                              " (the fused kernel could not be built)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
