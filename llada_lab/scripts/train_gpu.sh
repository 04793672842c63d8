#!/usr/bin/env bash
# The embedded model's v2 run on one CUDA GPU: train a candidate within a time budget (bf16 autocast,
# 128 x 512-token sequences per step, 8 sample-building workers, the confidence-aware loss), then score
# it beside the shipped model on held-out standard-library and third-party files in parallel processes,
# and print one summary ending in "v2 ships: yes|no" (the rule: llada_lab/training/candidate.py;
# the run: llada_lab/commands/candidate.py).
# Resumes: a run folder that holds state.pt continues up to the same total budget.
#
# The GPU machine has no network, so build the corpus beforehand where pip reaches PyPI:
#   llada-lab corpus            # -> .corpus/{train,heldout,heldout-thirdparty}.jsonl.gz
# and bring .corpus/*.jsonl.gz along (about 11 MB).
#
# Usage: llada_lab/scripts/train_gpu.sh OUT [MINUTES] [FLAGS...]
#   OUT      run folder; the candidate is written to OUT/export, the summary to OUT/summary.{md,json}
#   MINUTES  training budget (default 7)
#   FLAGS    for `llada-lab candidate`, and from there for `llada-lab train`, e.g.
#            --phase train (only train), --phase eval (only score), --recipe scratch (a 12.3M network
#            from random weights instead of continuing the shipped one), --jobs 8, --n 300
set -euo pipefail
out=${1:?usage: llada_lab/scripts/train_gpu.sh OUT [MINUTES] [FLAGS...]}
minutes=${2:-7}
shift $(($# < 2 ? $# : 2))
exec python3 -m llada_lab candidate --out "$out" --minutes "$minutes" --corpus "${CORPUS:-.corpus}" \
    --device cuda --eval-device cuda --jobs "${JOBS:-12}" "$@"
