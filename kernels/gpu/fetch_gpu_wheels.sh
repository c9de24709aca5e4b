#!/usr/bin/env bash
# Download exactly the wheels of kernels/gpu/gpu_wheels.txt into .whl/ (git-ignored), for the GPU machines'
# CPython 3.12 on x86-64 Linux, on a machine that reaches a package registry. Then carry .whl to the
# device and run kernels/gpu/gpu_session.sh there (it installs them). A package published only as a
# source distribution is built into a wheel here (pure Python ones only: sqlitedict, word2number,
# rouge-score).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
mkdir -p .whl
platforms=()
for n in 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
grep -v '^\s*#' kernels/gpu/gpu_wheels.txt | grep -v '^\s*$' | while read -r spec; do
    if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${platforms[@]}" -d .whl "$spec" 2>/dev/null; then
        "$PY" -m pip wheel --quiet --no-deps -w .whl "$spec"   # sdist only: build the (pure Python) wheel
    fi
done
ls .whl | wc -l | xargs echo "wheels:"
du -sh .whl
