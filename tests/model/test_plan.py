"""The memory planner against the published figures of LLaDA2.1-mini and -flash (configs written from the
model cards' shapes, no download), its placement over several devices, and `llada-lsp plan` as a user
runs it.

GB here is decimal (1e9 bytes): the published 32.5 GB / 206 GB are params x 2 bytes / 1e9 (16.3B and
102.9B params); in GiB they would read 30.3 / 191.6.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from llada_lsp.commands.plan import plan_main
from llada_lsp.model.loader import EMBEDDED_MODEL, stored_shapes
from llada_lsp.model.plan import (
    ModelShape,
    fp8_scale_bytes,
    make_plan,
    parse_bytes,
    weights_from_config,
    weights_from_headers,  # fmt: skip
)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
MINI, FLASH = str(CONFIGS / "llada2.1-mini.json"), str(CONFIGS / "llada2.1-flash.json")
GB = 10**9


@pytest.mark.parametrize(("config", "quantize", "published_gb"), [
    (MINI, None, 32.5),
    (FLASH, None, 206.0),
    (FLASH, "fp8", 104.5),  # the 103-106 GB: FP8 experts, everything else bf16
])  # fmt: skip
def test_weights_match_the_published_sizes(config, quantize, published_gb):
    plan = make_plan(config, ["cpu"], [10**15], quantize=quantize, context=0)
    assert plan.weights / GB == pytest.approx(published_gb, rel=0.03)
    assert plan.kv_bytes == 0


def test_fp8_experts_are_one_byte_plus_block_scales():
    bf16 = make_plan(FLASH, memory=[10**15], context=0).devices[0]
    fp8 = make_plan(FLASH, memory=[10**15], quantize="fp8", context=0).devices[0]
    per_layer = 256 * (3 * 1024 * 4096 + 3 * fp8_scale_bytes(1024, 4096))  # 8x32 tiles of 4 bytes per matrix
    assert fp8.part("routed experts") == 31 * per_layer == bf16.part("routed experts") // 2 + 31 * 256 * 3 * 1024
    assert all(fp8.part(p) == bf16.part(p) for p in ("embeddings", "attention", "router", "lm_head"))
    assert fp8_scale_bytes(130, 128) == 2 * 1 * 4  # a partial tile still has its scale


def test_kv_cache_per_token():
    assert make_plan(MINI, memory=[GB]).kv_bytes_per_token == 40 * 1024
    assert make_plan(FLASH, memory=[GB]).kv_bytes_per_token == 64 * 1024
    plan = make_plan(FLASH, memory=[10**15], context=4096, batch=3)
    assert plan.kv_bytes == 64 * 1024 * 4096 * 3


def test_two_devices_split_layers_contiguously_and_balanced():
    plan = make_plan(FLASH, ["cuda:0", "cuda:1"], [141 * GB], context=4096)
    first, last = plan.devices
    assert first.part("embeddings") > 0 and last.part("embeddings") == 0
    assert last.part("lm_head") > 0 and first.part("lm_head") == 0
    assert first.layers + last.layers == list(range(32)) and first.layers[-1] + 1 == last.layers[0]
    # balanced: moving the boundary by one layer would not make the larger side smaller
    one_layer = max(sum(s.parts.values()) for s in first.slots + last.slots)
    assert abs(first.total - last.total) < one_layer
    assert plan.weights == make_plan(FLASH, ["cpu"], [10**15], context=4096).weights
    assert plan.fits


def test_memory_sizes():
    assert parse_bytes("141GB") == 141 * GB and parse_bytes("80GiB") == 80 * 2**30 and parse_bytes("512") == 512
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_headers_agree_with_config_and_with_the_file_size_of_the_embedded_model():
    import json

    file = EMBEDDED_MODEL / "model.safetensors"
    with file.open("rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    payload = file.stat().st_size - 8 - header
    shape = ModelShape.from_config(json.loads((EMBEDDED_MODEL / "config.json").read_text()), "tiny")
    from_headers = weights_from_headers(stored_shapes([file]), shape, "bfloat16")
    from_config = weights_from_config(shape, "bfloat16")
    total = sum(sum(s.parts.values()) for s in from_headers)
    assert total == pytest.approx(payload, rel=0.01)
    assert [s.parts for s in from_headers] == [s.parts for s in from_config]
    fp8 = weights_from_headers(stored_shapes([file]), shape, "bfloat16", "fp8")
    assert [s.parts for s in fp8] == [s.parts for s in weights_from_config(shape, "bfloat16", "fp8")]


def test_cli_flash_bf16_on_80gb_does_not_fit(capsys):
    assert plan_main(["--model", FLASH, "--dtype", "bfloat16", "--memory", "80GB", "--context", "4096"]) == 1
    out, err = capsys.readouterr()
    assert "routed experts" in out and "199.72 GB" in out and "NO" in out
    assert err.count("\n") == 1 and "does not fit" in err and "80.00 GB" in err


def test_cli_flash_fp8_fits_one_h200(capsys):
    assert plan_main(["--model", FLASH, "--quantize", "fp8", "--memory", "141GB"]) == 0
    out, _ = capsys.readouterr()
    assert "fp8 routed experts" in out and "yes" in out


def test_cli_embedded_model_by_default(capsys):
    assert plan_main(["--device", "cpu", "--memory", "1GB"]) == 0
    out, _ = capsys.readouterr()
    assert "embedded model (from safetensors headers)" in out and "lm_head" in out


def test_cli_split_over_two_devices(capsys):
    assert plan_main(["--model", MINI, "--devices", "cuda:0,cuda:1", "--memory", "24GB,24GB"]) == 0
    out, _ = capsys.readouterr()
    assert "cuda:0" in out and "cuda:1" in out and "total" in out


@pytest.mark.parametrize("argv", [
    ["--quantize", "int4"],
    ["--memory", "lots"],
    ["--devices", "cuda:0,cuda:1", "--memory", "1GB,2GB,3GB"],
    ["--dtype", "int8"],
])  # fmt: skip
def test_cli_bad_input_exits_2(argv):
    with pytest.raises(SystemExit) as exit:
        plan_main(argv)
    assert exit.value.code == 2


def test_cli_unknown_model_exits_2(tmp_path, capsys):
    assert plan_main(["--model", str(tmp_path / "nope")]) == 2
    _, err = capsys.readouterr()
    assert "no such model folder" in err


def test_help_loads_no_torch():
    code = (
        "import sys\nfrom llada_lsp.cli import main\ntry:\n    main(['plan', '--help'])\n"
        "except SystemExit as e:\n    assert e.code == 0\nassert 'torch' not in sys.modules, 'torch imported'"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--quantize" in p.stdout


# --- the same plan guards every load ---------------------------------------------------------------


def test_a_load_that_does_not_fit_is_refused_with_the_table_before_any_tensor_is_read(monkeypatch):
    import llada_lsp.model.plan as plan_module
    from llada_lsp.errors import DoesNotFit
    from llada_lsp.model import load_model

    monkeypatch.setattr(plan_module, "free_memory", lambda device: 10**6)
    asked = []
    with pytest.raises(DoesNotFit) as refused:
        load_model(None, device="cpu", dtype="float32", cancelled=lambda: asked.append(1) or False)
    assert asked == []  # asked before each tensor is read: none was
    err = refused.value
    assert err.reason.endswith("does not fit: cpu needs 40.34 MB (38.24 MB weights + 2.10 MB KV cache) but has 1.00 MB")
    assert "routed experts" in err.table and err.table.splitlines()[-1].split() == ["fits", "NO"]
    assert str(err) == f"{err.reason}\n{err.table}"


def test_the_service_and_its_flags_load_through_the_same_check(monkeypatch):
    """The engine service's load (backends/native.load, what ModelWorker runs) refuses the same way, and its
    --quantize / --devices reach load_model."""
    import llada_lsp.model.plan as plan_module
    from llada_lsp.backends.native import load
    from llada_lsp.commands.engine import parser
    from llada_lsp.completion.generation import ModelSpec
    from llada_lsp.errors import DoesNotFit

    args = parser().parse_args(["--quantize", "fp8", "--devices", "cpu,cpu"])
    assert (args.quantize, args.devices, args.device) == ("fp8", ("cpu", "cpu"), None)
    with pytest.raises(SystemExit):
        parser().parse_args(["--devices", "cpu"])
    monkeypatch.setattr(plan_module, "free_memory", lambda device: 10**6)
    spec = ModelSpec(None, None, "float32", quantize=args.quantize, devices=args.devices)
    with pytest.raises(DoesNotFit, match=r"cpu needs \d+\.\d\d MB \(\d+\.\d\d MB weights"):
        load(spec, lambda *_: None)


@pytest.mark.parametrize(("device", "memory", "dtype"), [("cpu", "1TB", "float32"), ("cuda:0", "80GB", "bfloat16")])
def test_plan_names_the_dtype_the_model_is_loaded_in_there(device, memory, dtype, capsys):
    """The loader, given no dtype, runs float32 on the CPU and bfloat16 on a GPU (resolve_dtype): the
    plan's default says and counts the same (it said bfloat16 for the embedded model on the CPU)."""
    from llada_lsp.model.loader import resolve_dtype

    torch = pytest.importorskip("torch")
    assert str(resolve_dtype(None, torch.device(device))) == f"torch.{dtype}"
    assert plan_main(["--device", device, "--memory", memory]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert f": {dtype} weights;" in title
    assert plan_main(["--device", device, "--memory", memory, "--dtype", "float16"]) == 0
    assert ": float16 weights;" in capsys.readouterr().out.splitlines()[0]
