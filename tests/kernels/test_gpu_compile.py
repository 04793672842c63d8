"""Every Triton kernel compiled ahead of time for Hopper (sm_90) and Ampere (sm_80) on the CPU, with the
launchers' real argument bindings at LLaDA2.1-mini and -flash shapes (llada_lab/aot.py), and
the kernels' declared targets: FP8 experts below sm_89 and a kernel that fails to compile at run time
take the torch path instead of raising.

Nothing here decorates a kernel in this process: tests/kernels/test_triton_kernels.py needs them decorated by
Triton's interpreter, so the compile runs in a fresh process without TRITON_INTERPRET.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
KERNELS = {"_fused_moe_gate_up_kernel", "_fused_moe_down_kernel", "_row_confidence_kernel", "_joint_threshold_kernel"}


@pytest.mark.slow  # ~40 s idle (60 variants through triton.compile and ptxas; less with Triton's cache)
@pytest.mark.timeout(900)
@needs_triton
def test_every_kernel_compiles_for_sm90_and_sm80_without_spills(tmp_path):
    from triton.backends.nvidia.compiler import get_ptxas

    if not os.path.exists(get_ptxas(90).path):
        pytest.skip("triton's bundled ptxas is missing from this install")
    report = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-m", "llada_lab", "compile-kernels", "--arch", "90", "80", "--json", str(report)],
                         check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)  # fmt: skip
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    variants = json.loads(report.read_text())
    failed = [v for v in variants if v["supported"] and (not v["ok"] or v["spill_bytes"])]
    assert not failed, "\n".join(f"sm_{v['target']} {v['kernel']} {v['case']}: {v['error'] or 'spills'}"
                                  for v in failed)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    for target in (90, 80):  # every kernel, in every dtype it is launched with, compiled for both targets
        compiled = {(v["kernel"], v["case"].split("x=")[-1]) for v in variants if v["ok"] and v["target"] == target}
        assert {k for k, _ in compiled} == KERNELS
        moe_dtypes = {d for k, d in compiled if k == "_fused_moe_gate_up_kernel"}
        assert {"float32 w=same", "float16 w=same", "bfloat16 w=same"} <= moe_dtypes
    fp8_90 = [v for v in variants if v["target"] == 90 and "w=fp8" in v["case"]]
    assert fp8_90 and all(v["ok"] and v["supported"] for v in fp8_90)
    # sm_80 has no fp8e4nv: the kernels say so, and the one compiled to show it really fails.
    fp8_80 = [v for v in variants if v["target"] == 80 and "w=fp8" in v["case"]]
    assert fp8_80 and not any(v["supported"] for v in fp8_80)
    assert all("fp8e4nv" in (v["error"] or "") for v in fp8_80)


def cuda_like(dtype):
    """What kernels.enabled reads of a CUDA tensor, on a machine without one."""
    return types.SimpleNamespace(is_cuda=True, dtype=dtype, device="cuda:0")


@needs_triton
@pytest.mark.parametrize("capability, fp8_ok", [((9, 0), True), ((8, 9), True), ((8, 0), False), ((8, 6), False)])
def test_fp8_experts_below_sm89_take_the_torch_path(monkeypatch, capability, fp8_ok):
    from llada_lsp import kernels

    monkeypatch.setattr(kernels, "_capability", lambda device: capability)
    assert kernels.enabled(cuda_like(torch.bfloat16))
    assert kernels.enabled(cuda_like(torch.bfloat16), torch.bfloat16)
    assert kernels.enabled(cuda_like(torch.bfloat16), torch.float8_e4m3fn) is fp8_ok
    monkeypatch.setattr(kernels, "_capability", lambda device: (7, 5))  # below Ampere: no kernel at all
    assert not kernels.enabled(cuda_like(torch.float16))


@needs_triton
def test_a_kernel_that_fails_to_compile_is_logged_once_and_the_torch_path_runs(monkeypatch, caplog):
    from triton.runtime.errors import PTXASError

    from llada_lsp import kernels
    from llada_lsp.model.config import LLaDA2Config
    from llada_lsp.model.llada2 import SparseMoE

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise PTXASError("ptxas fatal: Unresolved extern function (a kernel broken for this GPU)")

    # A stand-in module, so no kernel is decorated in this process (see the module docstring).
    monkeypatch.setitem(sys.modules, "llada_lsp.kernels.fused_moe", types.SimpleNamespace(fused_moe=broken))
    monkeypatch.setattr(kernels.FALLBACKS, "failed", {})
    monkeypatch.setattr(kernels, "enabled", lambda x, weight_dtype=None: True)
    config = LLaDA2Config(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, n_group=2,
                          topk_group=1, num_shared_experts=0)  # fmt: skip
    torch.manual_seed(0)
    moe = SparseMoE(config)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(1, 5, 32)
    moe.force = "sparse"
    want = moe(x)
    moe.force = None
    with caplog.at_level(logging.WARNING, logger="llada_lsp.kernels"):
        first, second = moe(x), moe(x)
    assert len(calls) == 1, "a kernel that failed to compile must not be tried again"
    warnings = [r for r in caplog.records if "failed to compile" in r.getMessage()]
    assert len(warnings) == 1 and "fused_moe" in warnings[0].getMessage()
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(second, want)
