#!/usr/bin/env bash
# Every GPU check of the GPU-speed issue in one run (< 8 min on one H200), so a lent device is used once:
#   1. the Triton kernels against their torch references on CUDA (bf16, fp16, fp32; tests/test_kernels.py)
#   2. the engine's golden cases on CUDA in bf16 with the kernels on (tests/test_cuda.py's per-row bar)
#   3. the bench table: mini bf16 one block at 1k context (eager and CUDA graph), a batch of 8 blocks,
#      flash-shaped layers with FP8 experts projected to 32 layers, and one profile of a mini step
#   4. with GPU_CHECK_HOST_FLASH=1 (the hosting issue, ~2-3 min more): flash with FP8 experts, all 32
#      layers, on this one GPU: the plan against torch.cuda.memory_allocated, one step timed
#      (examples/host_flash_check.py)
# then one summary against the issue's bars. Exit 0: all passed; 1: something failed; 2: no CUDA.
# Usage: [GPU_CHECK_HOST_FLASH=1] bash examples/gpu_check.sh   (logs in $GPU_CHECK_LOGS, default a fresh
# temporary folder)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device on this machine (torch.cuda.is_available() is False): nothing checked."
  exit 2
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(), '| torch', torch.__version__)"
if "$PY" -c "import triton" 2>/dev/null; then
  KERNELS="Triton kernels on"
else
  KERNELS="triton missing: kernel tests skip and the model runs its torch paths"
fi
echo "gpu_check: $KERNELS; logs in $LOGS"

declare -a NAMES STATUS
run() {  # run NAME SECONDS COMMAND...: time-boxed, logged, status kept for the summary
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  NAMES+=("$name")
  STATUS+=("$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo "TIMEOUT ${limit}s" || echo "FAILED rc=$rc"; })")
  echo "gpu_check: $name: ${STATUS[-1]} ($((SECONDS - start)) s)"
}

run kernels 150 "$PY" -m pytest tests/test_kernels.py -q -rs -p no:cacheprovider
run golden_cuda 180 "$PY" -m pytest tests/test_cuda.py -q -rs -p no:cacheprovider
BENCH=("$PY" -m llada_lsp bench --device cuda --iters 20)
run mini_eager 90 "${BENCH[@]}" --shape llada2.1-mini --context 1024
run mini_graph 90 "${BENCH[@]}" --shape llada2.1-mini --context 1024 --cuda-graph
run mini_batch8 90 "${BENCH[@]}" --shape llada2.1-mini --context 1024 --batch 8 --cuda-graph
run flash_fp8 120 "${BENCH[@]}" --shape llada2.1-flash --layers 4 --quantize fp8 --context 1024 --cuda-graph
run mini_profile 90 "${BENCH[@]}" --shape llada2.1-mini --context 1024 --iters 3 --profile
if [ "${GPU_CHECK_HOST_FLASH:-0}" = 1 ]; then
  run host_flash 240 "$PY" examples/host_flash_check.py --context 4096
fi

echo
echo "================ gpu_check summary ================"
for i in "${!NAMES[@]}"; do printf '%-14s %s\n' "${NAMES[$i]}" "${STATUS[$i]}"; done
grep -h "passed\|failed\|skipped" "$LOGS/kernels.log" "$LOGS/golden_cuda.log" | tail -n 4
[ -f "$LOGS/host_flash.log" ] && tail -n 1 "$LOGS/host_flash.log"
echo
echo "bench (first line of each run, then its table):"
for name in mini_eager mini_graph mini_batch8 flash_fp8; do
  echo "-- $name"
  grep -E "^(llada2|\|)" "$LOGS/$name.log" | grep -v "^|---" || echo "   (no table: see $LOGS/$name.log)"
done
# The bars: mini one block <= 8 ms; a batch of 8 <= 2x one block; flash FP8 projected to 32 layers <= 22 ms.
"$PY" - "$LOGS" <<'PYEOF'
import re, sys
from pathlib import Path
logs = Path(sys.argv[1])
def ms(name, label):
    f = logs / f"{name}.log"
    text = f.read_text() if f.exists() else ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(label):
            return float(cells[1])
    return None
one, eight = ms("mini_graph", "20 of 20"), ms("mini_batch8", "20 of 20")
flash = ms("flash_fp8", "32 (projected)")
bars = [("mini bf16, 1 block at 1k, CUDA graph <= 8 ms", one, one is not None and one <= 8),
        ("mini batch of 8 <= 2x one block", eight, None not in (one, eight) and eight <= 2 * one),
        ("flash FP8 experts, projected 32 layers <= 22 ms", flash, flash is not None and flash <= 22)]
for text, value, ok in bars:
    print(f"{'PASS' if ok else 'MISS'}  {text}: {'n/a' if value is None else f'{value:.2f} ms'}")
sys.exit(0 if all(ok for *_, ok in bars) else 1)
PYEOF
BARS=$?
FAILED=0
for s in "${STATUS[@]}"; do [ "$s" = ok ] || FAILED=1; done
echo "==================================================="
if [ $FAILED -eq 0 ] && [ $BARS -eq 0 ]; then echo "gpu_check: all checks passed, all bars met"; exit 0; fi
echo "gpu_check: $([ $FAILED -ne 0 ] && echo 'a check failed' || echo 'checks passed'); $([ $BARS -ne 0 ] && echo 'a bar missed' || echo 'bars met') (logs: $LOGS)"
exit 1
