#!/usr/bin/env bash
# Install the carried wheels (kernels/gpu/gpu_wheels.txt, fetched by kernels/gpu/fetch_gpu_wheels.sh) into TARGET the one
# way both the GPU machines (kernels/gpu/gpu_session.sh) and their CPU stand-in (kernels/gpu/emulate_gpu_image.sh) do:
# from the folder only, nothing resolved (--no-deps: kernels/gpu/gpu_bundle.py checks the requirements instead),
# over what TARGET already holds. Run with the Python that will import them (PYTHON, default python3).
#
#   bash kernels/gpu/install_carried_wheels.sh WHEEL_DIR TARGET
set -euo pipefail
WHEEL_DIR=${1:?usage: bash kernels/gpu/install_carried_wheels.sh WHEEL_DIR TARGET}
TARGET=${2:?usage: bash kernels/gpu/install_carried_wheels.sh WHEEL_DIR TARGET}
"${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TARGET" \
    "$WHEEL_DIR"/*.whl
