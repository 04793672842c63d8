#!/usr/bin/env bash
# Trains the embedded model on one CUDA GPU, as the shipped checkpoint was trained (see the README,
# "The embedded model"): bf16 autocast, 128 x 512-token sequences per step, samples built by 8 worker
# processes, a cosine schedule fitted to the time budget. Resumes when OUT already holds a state.pt.
#
# Usage: examples/train_gpu.sh OUT [MINUTES] [CORPUS] [TRAIN FLAGS...]
#   OUT      run folder; the shippable model is written to OUT/export
#   MINUTES  training time budget (default 7)
#   CORPUS   a corpus file from `python -m llada_lsp.training.corpus train FILE`, to train on another
#            machine's Python exactly the files of the interpreter that wrote it ('' or absent: this one's)
#   FLAGS    passed on to `llada-lsp train`, e.g. a fine-tune of the shipped model:
#            examples/train_gpu.sh runs/ft 10 '' --init-from llada_lsp/data/tiny --lr 1e-3 --self-fill 0.5
set -euo pipefail
out=${1:?usage: examples/train_gpu.sh OUT [MINUTES] [CORPUS] [TRAIN FLAGS...]}
minutes=${2:-7}
corpus=${3:-}
shift $(($# < 3 ? $# : 3))
mkdir -p "$out"
# The shipped BPE vocabulary (trained on the same split), so checkpoints stay interchangeable.
[ -f "$out/tokenizer.json" ] || cp llada_lsp/data/tiny/tokenizer.json llada_lsp/data/tiny/tokenizer_config.json "$out/"
exec python3 -m llada_lsp.training.train --out "$out" --device cuda --save-every 500 \
    --hours "$(python3 -c "print($minutes / 60)")" --export "$out/export" ${corpus:+--corpus "$corpus"} "$@"
