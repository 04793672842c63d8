#!/usr/bin/env bash
# Installs the pinned SGLang that tests/e2e/sglang/test_sglang_real.py runs, into a virtual environment in a cache
# folder outside the repository (LLADA_SGLANG_HOME, default ~/.cache/llada-lsp/sglang-0.5.23), and only
# when it is not there yet: a second run returns at once. About 4 minutes and 6.3 GB the first time.
#
# What a CPU needs (docs/sglang.md, "Running SGLang on a CPU"):
# - torch 2.14.1 with torchvision 0.29.1 (SGLang 0.5.23 pins torch 2.14.1; the CUDA build runs without
#   a GPU, and a torchvision from another torch fails SGLang's start with "torchvision::nms does not
#   exist");
# - sglang itself with --no-deps, then its plain dependencies, leaving out the CUDA kernel packages
#   (flashinfer, deep-gemm, flash-attn, cutlass, ...), which a CPU never imports;
# - a stand-in `sgl_kernel` module: SGLANG_USE_CPU_ENGINE=1 imports it, its CPU build is not published,
#   and on a CPU without AMX the only function SGLang calls is assign_req_to_token_pool_cpu, which
#   tests/e2e/sglang/sgl_kernel_stub.py gives in plain torch.
# Prints the venv's python on success; the tests find it there (or through LLADA_SGLANG_PYTHON).
set -euo pipefail

SGLANG_VERSION=0.5.23
HOME_DIR="${LLADA_SGLANG_HOME:-$HOME/.cache/llada-lsp/sglang-$SGLANG_VERSION}"
VENV="$HOME_DIR/venv"
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${LLADA_SGLANG_BASE_PYTHON:-python3.11}"

if [ -f "$VENV/.complete" ] && [ -x "$VENV/bin/python" ]; then
  # The stand-in is refreshed every time: it is part of this repository, not of the cache.
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cp "$HERE/sgl_kernel_stub.py" "$site/sgl_kernel.py"
  echo "$VENV/bin/python"
  exit 0
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "install.sh: $PYTHON not found" >&2; exit 1; }

. "$HERE/../retry.sh"

rm -rf "$VENV"
mkdir -p "$HOME_DIR"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# This machine's pip constraints may cap torch below what SGLang pins; the venv is SGLang's alone.
export PIP_CONSTRAINT=
retry "${pip[@]}" torch==2.14.1 torchvision==0.29.1
retry "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION"
# SGLang's own dependency list (its wheel's METADATA) less the GPU kernel packages, with its pins.
retry "${pip[@]}" \
  aiohttp "anthropic>=0.20.0" blobfile==3.0.0 build compressed-tensors==0.18.0 datasets distro easydict \
  einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2.0.0" "mistral_common>=1.11.5" modelscope \
  msgspec ninja numba==0.65.1 numpy nvidia-ml-py openai==2.8.0 openai-harmony==0.0.4 orjson \
  outlines==0.1.11 packaging partial_json_parser pillow "prometheus-client>=0.20.0" psutil pybase64 \
  pydantic "python-dateutil<3" python-multipart "pyzmq>=25.1.2" regex requests scipy \
  sentencepiece==0.2.1 setproctitle soundfile==0.13.1 tiktoken timm==1.0.25 tokenizers==0.23.2 tqdm \
  transformers==5.19.0 "uvicorn>=0.51" uvloop watchfiles xgrammar==0.2.7 xxhash zstandard \
  torch==2.14.1 torchvision==0.29.1
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$HERE/sgl_kernel_stub.py" "$site/sgl_kernel.py"
# The check that matters: the server module imports with the CPU engine on.
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sglang.srt.entrypoints.http_server" >/dev/null
touch "$VENV/.complete"
echo "$VENV/bin/python"
