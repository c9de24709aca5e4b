#!/usr/bin/env bash
# A CPU stand-in for the GPU machines' Python stack, to rehearse at no device time what runs
# there: the image's packages that the harness needs, at the image's versions where they are known
# (`kernels/gpu/gpu_bundle.py --image-pins`), and the carried wheels (kernels/gpu/gpu_wheels.txt) installed over
# them as kernels/gpu/gpu_session.sh installs them (pip --no-deps --target: nothing resolved). Under it run the
# imports, `kernels/gpu/gpu_bundle.py --installed`, the suite's CPU paths on the image's Triton,
# `kernels/bench/inspect_sass.py` with the device's compiler, or gpu_session.sh itself on a tiny profile. It found
# two things that would have failed there: huggingface-hub 2 imports httpx2, which the image lacks; and the
# interpreter of triton 3.6 fails on some kernels (README, Kernels).
#
#   bash kernels/gpu/emulate_gpu_image.sh /tmp/gpu-image                   # build (minutes; pip reaches a registry)
#   /tmp/gpu-image/run python -m pytest -q tests/numerics/test_kernels.py       # run anything under it, from the repo root
#
# What it stands in for, and with what: CPython 3.12.3 there by this machine's Python (the wheels are fetched
# for it); torch 2.11 CUDA 13 by torch 2.13 CPU, the only build here, with torch's own pin on triton ignored
# (3.6, as there); numpy 2.5.2 by numpy < 2.5 where Python is older than 3.12 (2.4 already refuses int() of a
# one-element array, the change the device's triton trips on).
set -euo pipefail
DIR=$(realpath -m "${1:?usage: bash kernels/gpu/emulate_gpu_image.sh DIR}")
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
"$PY" -m venv "$DIR/venv"
python=$DIR/venv/bin/python
old_python=$("$python" -c 'import sys; print(int(sys.version_info < (3, 12)))')
pins=$("$PY" kernels/gpu/gpu_bundle.py --image-pins | sed -e 's/^torch==.*/torch==2.13.0/' -e '/^triton==/d')
if [ "$old_python" = 1 ]; then pins=$(sed -e 's/^numpy==.*/numpy<2.5/' <<< "$pins"); fi
echo "the image's packages: $(tr '\n' ' ' <<< "$pins")"
# shellcheck disable=SC2086  # one requirement a word
"$python" -m pip install --quiet $pins
"$python" -m pip install --quiet --no-deps triton==3.6.0
grep -v '^\s*#' kernels/gpu/gpu_wheels.txt | grep -v '^\s*$' > "$DIR/wheels.txt"
"$python" -m pip wheel --quiet --no-deps -w "$DIR/whl" -r "$DIR/wheels.txt"   # sdist-only ones built, as there
PYTHON=$python bash kernels/gpu/install_carried_wheels.sh "$DIR/whl" "$DIR/site"   # as gpu_session.sh installs them
cat > "$DIR/run" <<EOF
#!/usr/bin/env bash
# Run a command under the stand-in of the GPU machines' stack, as gpu_session.sh runs it there: its python
# first on PATH (python, python3), the carried packages, then the working folder, first on PYTHONPATH.
export PATH="$DIR/venv/bin:\$PATH" PYTHONPATH="$DIR/site:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}"
exec "\$@"
EOF
chmod +x "$DIR/run"
"$DIR/run" python -c 'import torch, triton, transformers, trl, lm_eval
print("stand-in ready: torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__,
      "trl", trl.__version__)'
"$DIR/run" python kernels/gpu/gpu_bundle.py --installed
