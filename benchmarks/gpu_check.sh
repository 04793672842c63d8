#!/usr/bin/env bash
# Every GPU check in one device command that fits the 600 s a device command may run: each step is
# time-boxed and the boxes add up to at most 540 s (tests/lab/test_gpu_check_script.py checks the sum),
# so the summary is always written and printed, whatever times out. The steps:
#   probe        the interpreter sees a CUDA device (else exit 2, with the summary saying so)
#   kernels      the Triton kernels against their torch references on CUDA, flash-attn's varlen step
#                against SDPA, the engine's CUDA-graph steps against eager ones (tests/kernels/test_triton_kernels.py,
#                tests/engine/test_gpu_flash.py, tests/engine/test_gpu_graphs.py)
#   golden_cuda  the golden bf16 bar on CUDA, SDPA and flash-attn (tests/model/test_bf16.py)
#   mini_1_eager / mini_1_graph / mini_8_eager / mini_8_graph
#                ms per denoising step at LLaDA2.1-mini shapes, 1k context, 1 and 8 sequences, without
#                and with a CUDA graph, against the bandwidth floor (llada-lsp bench --shape)
#   flash_fp8    4 flash-shaped layers with FP8 experts, projected to all 32
#   serve_mini   the engine's scheduler serving 8 sequences at mini shapes, eager and CUDA graphs
#                (benchmarks/bench_gpu_scheduler.py)
# Logs and summary.json go to $OUT/gpu_check when OUT is set (a device run's $OUT comes back), else to
# $GPU_CHECK_LOGS, else to a fresh temporary folder. The summary is printed last.
# Exit 0: all passed; 1: something failed or timed out; 2: no CUDA device.
# Usage: [PYTHON=python3] [OUT=dir] bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${OUT:-}" ]; then LOGS=$OUT/gpu_check; else LOGS=${GPU_CHECK_LOGS:-$(mktemp -d)}; fi
mkdir -p "$LOGS"
STARTED=$SECONDS

declare -a NAMES STATUS TOOK
run() {  # run NAME SECONDS COMMAND...: time-boxed, logged, its status kept for the summary
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout -k 2 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  NAMES+=("$name")
  TOOK+=("$((SECONDS - start))")
  STATUS+=("$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo "timeout ${limit}s" || echo "failed rc=$rc"; })")
  echo "gpu_check: $name: ${STATUS[-1]} (${TOOK[-1]} s)"
}

summary() {  # summary.json from the logs, printed last
  local steps=""
  for i in "${!NAMES[@]}"; do steps+="${NAMES[$i]}=${STATUS[$i]}=${TOOK[$i]};"; done
  timeout -k 2 15 "$PY" - "$LOGS" "$steps" "$((SECONDS - STARTED))" <<'PYEOF'
import json, re, sys
from pathlib import Path
logs, steps, total = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def text(name):
    f = logs / f"{name}.log"
    return f.read_text(errors="replace") if f.exists() else ""
def pytest_line(name):
    lines = [l for l in text(name).splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    return lines[-1].strip("= ") if lines else None
def bench(name, label):
    """The bench table's row whose first cell starts with `label` -> its figures."""
    head = next((l for l in text(name).splitlines() if l.startswith(("llada2", "llada2.1"))), None)
    for line in text(name).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(label) and len(cells) >= 8:
            return {"ms_per_step": float(cells[1]), "gb_per_step": cells[2], "gbs": cells[3], "of_peak": cells[4],
                    "floor_ms": cells[5], "x_floor": cells[6], "tokens_per_s": cells[7], "setup": head}
    return None
def served(name):
    f = logs / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None
out = {
    "steps": {s.split("=")[0]: {"status": s.split("=")[1], "seconds": int(s.split("=")[2])}
              for s in steps.split(";") if s},
    "seconds": total,
    "kernel_parity_cuda": pytest_line("kernels"),
    "golden_bf16_cuda": pytest_line("golden_cuda"),
    "mini_ms_per_step_1k": {k: bench(f"mini_{k}", "20 of 20") for k in ("1_eager", "1_graph", "8_eager", "8_graph")},
    "flash_fp8_projected_32_layers": bench("flash_fp8", "32 (projected)"),
    "serving_mini": {"eager": served("serve_eager"), "cuda_graph": served("serve_graph")},
    "unmeasured": [],
}
out["unmeasured"] = [k for k, v in out.items() if v is None] + [
    f"mini_{k}" for k, v in out["mini_ms_per_step_1k"].items() if v is None] + [
    f"serving_{k}" for k, v in out["serving_mini"].items() if v is None]
(logs / "summary.json").write_text(json.dumps(out, indent=1))
print("================ gpu_check summary (also in %s) ================" % (logs / "summary.json"))
for name, step in out["steps"].items():
    print(f"{name:14s} {step['status']:18s} {step['seconds']:4d} s")
print(f"kernel parity on CUDA:  {out['kernel_parity_cuda']}")
print(f"golden bf16 on CUDA:    {out['golden_bf16_cuda']}")
for k, v in out["mini_ms_per_step_1k"].items():
    print(f"mini {k:8s} 1k ctx:   " + (f"{v['ms_per_step']:.2f} ms/step, floor {v['floor_ms']} ms ({v['x_floor']}), "
                                      f"{v['gbs']} GB/s, {v['tokens_per_s']} tok/s" if v else "unmeasured"))
f = out["flash_fp8_projected_32_layers"]
print("flash FP8, 32 layers:   " + (f"{f['ms_per_step']:.2f} ms/step, floor {f['floor_ms']} ms ({f['x_floor']})" if f else "unmeasured"))
for k, v in out["serving_mini"].items():
    print(f"serving mini {k:10s} " + (f"{v['ms_per_step']:.2f} ms/step, {v['rows_per_step']:.2f} rows/step, "
                                       f"{v['tokens_per_s']:.0f} tok/s" if v else "unmeasured"))
print(f"total {total} s; unmeasured: {', '.join(out['unmeasured']) or 'none'}")
PYEOF
}

if ! timeout -k 2 15 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >"$LOGS/probe.log" 2>&1; then
  echo "gpu_check: no CUDA device for $PY (torch.cuda.is_available() is False, or $PY has no torch): nothing checked."
  NAMES+=(probe); STATUS+=("no CUDA"); TOOK+=("$((SECONDS - STARTED))")
  summary
  exit 2
fi
timeout -k 2 10 "$PY" -c "import torch, importlib.util as u; print('gpu_check:', torch.cuda.get_device_name(), '| torch',
  torch.__version__, '| triton', bool(u.find_spec('triton')), '| flash-attn', bool(u.find_spec('flash_attn')))" \
  | tee -a "$LOGS/probe.log"

PYTEST=("$PY" -m pytest -q -rs -p no:cacheprovider)
run kernels 80 "${PYTEST[@]}" tests/kernels/test_triton_kernels.py tests/engine/test_gpu_flash.py tests/engine/test_gpu_graphs.py
run golden_cuda 90 "${PYTEST[@]}" tests/model/test_bf16.py
BENCH=("$PY" -m llada_lsp bench --device cuda --iters 20 --context 1024)
run mini_1_eager 70 "${BENCH[@]}" --shape llada2.1-mini
run mini_1_graph 40 "${BENCH[@]}" --shape llada2.1-mini --cuda-graph
run mini_8_eager 40 "${BENCH[@]}" --shape llada2.1-mini --batch 8
run mini_8_graph 40 "${BENCH[@]}" --shape llada2.1-mini --batch 8 --cuda-graph
run flash_fp8 55 "${BENCH[@]}" --shape llada2.1-flash --layers 4 --quantize fp8 --cuda-graph
run serve_eager 30 "$PY" benchmarks/bench_gpu_scheduler.py --batch 8 --json "$LOGS/serve_eager.json"
run serve_graph 30 "$PY" benchmarks/bench_gpu_scheduler.py --batch 8 --cuda-graph --json "$LOGS/serve_graph.json"

echo
summary
FAILED=0
for s in "${STATUS[@]}"; do [ "$s" = ok ] || FAILED=1; done
exit $FAILED
