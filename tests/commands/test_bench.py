"""`llada-lsp bench --shape`: one denoising step at a real model's shapes, here on the CPU at the golden
checkpoint's tiny shapes (the same code path the GPU run takes, minus CUDA graphs and the kernels), and
the named shapes held to the real config.json files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from llada_lsp.commands import bench
from llada_lsp.engine import Engine
from llada_lsp.model import load_model
from llada_lsp.model.config import SIZE_KEYS, LLaDA2Config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


def table(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if re.match(r"\| \d", line)]


def test_the_timed_cached_run_pays_its_own_prefill(golden_dir):
    """The warm-up decodes the prompt's first two blocks; the timed run must compute them again, not
    take them from the warm-up (a prefix cache would), or the table measures less than it says."""
    model = load_model(golden_dir, device="cpu", dtype=torch.float32)
    prompt = [(7 * i) % 400 + 10 for i in range(96)]  # three whole blocks
    with_prefix_cache = Engine(model)  # what the bench must not time: the warm-up's blocks come back
    assert bench.compare(with_prefix_cache, Engine(model, use_cache=False), prompt, 32, "speed")[0].reused_tokens == 64
    cached, baseline = bench.engines(model)
    timed, reference, seconds = bench.compare(cached, baseline, prompt, 32, "speed")
    assert timed.reused_tokens == 0 and cached.cache.stats.hits == 0
    assert timed.prefill_forwards == 1 and timed.tokens == reference.tokens and seconds > 0


@pytest.mark.slow
def test_the_engine_comparison_prints_and_publishes_one_row_per_prompt(capsys, tmp_path, restore_threads):
    argv = ["--prompt-lengths", "64,96", "--gen-length", "32", "--threads", "1", "--markdown", str(tmp_path / "b.md")]
    assert bench.bench_main(argv) == 0
    rows = table(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["64", "96"] and all(r[-1] == "True" for r in rows)  # same tokens both ways
    assert table((tmp_path / "b.md").read_text()) == rows


@pytest.mark.parametrize("name", list(bench.SHAPES))
def test_named_shapes_are_the_real_configs(name):
    real = json.loads((CONFIGS / f"{name}.json").read_text())
    config, full, tpf = bench.shape_config(name, None, None)
    for key in SIZE_KEYS:
        assert getattr(config, key) == real[key], key
    assert full == real["num_hidden_layers"] and (tpf > 10 if name.startswith("llada2.1") else tpf is None)
    assert (config.mask_token_id, config.eos_token_id) == (real["mask_token_id"], real["eos_token_id"])
    for key in ("block_size", "expert_capacity", "max_position_embeddings", "rope_theta"):  # LLaDA2.2's keys too
        assert getattr(config, key) == real.get(key), key
    assert config.family == LLaDA2Config(**real).family  # LLaDA2.2: its block routing and the flash edit ids


def test_layers_keep_one_moe_layer_and_fp8_builds_fp8_experts():
    config, full, _ = bench.shape_config("llada2.1-flash", 1, "fp8")
    assert (config.num_hidden_layers, full) == (2, 32)  # layer 0 is dense: one MoE layer is added
    model = bench.random_weights(bench.shape_config(str(CONFIGS / ".." / ".." / "golden" / "llada2-tiny"), 2, "fp8")[0],
                                 torch.device("cpu"), torch.float32, 0)  # fmt: skip
    experts = model.model.layers[1].mlp.experts
    assert experts.w_gate.dtype == torch.float8_e4m3fn and experts.w_gate_scale_inv.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.float32 and not model.lm_head.weight.isnan().any()


def test_step_bench_on_the_cpu(golden_dir, capsys, tmp_path):
    assert bench.bench_main(["--shape", str(golden_dir / "config.json"), "--device", "cpu", "--dtype", "float32",
                             "--layers", "1", "--context", "64", "--iters", "2", "--peak-gbs", "10",
                             "--markdown", str(tmp_path / "step.md")]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    # --layers 1 builds 2 (layer 0 is dense): said, not silent
    assert err.splitlines()[0] == ("llada-lsp bench: --layers 1: building 2, since the first 1 is dense and one MoE "
                                   "layer is needed to time the experts")  # fmt: skip
    rows = table(out)
    assert table((tmp_path / "step.md").read_text()) == rows and "Command: `" in (tmp_path / "step.md").read_text()
    assert [r[0] for r in rows] == ["2 of 3", "3 (projected)"]
    (measured, projected) = rows
    assert 0 < float(measured[1]) < float(projected[1])  # ms: one more MoE layer costs time
    assert 0 < float(measured[2]) < float(projected[2])  # GB read
    touched = re.search(r"experts touched per layer: (\d+)-(\d+) of 16", out)
    assert touched and 4 <= int(touched[1]) <= int(touched[2]) <= 16  # 32 tokens x 4 experts each
    assert measured[-1] == "-"  # no paper figure for a config path


def test_layers_beyond_the_shape_are_said_and_none_refused(golden_dir, capsys):
    args = ["--shape", str(golden_dir), "--device", "cpu", "--dtype", "float32", "--context", "32", "--iters", "1"]
    assert bench.bench_main([*args, "--layers", "9"]) == 0
    out, err = capsys.readouterr()
    assert err == "llada-lsp bench: --layers 9: the shape has 3 layers; building 3\n"
    assert [r[0] for r in table(out)] == ["3 of 3"]
    with pytest.raises(SystemExit) as refused:
        bench.bench_main([*args, "--layers", "0"])
    assert refused.value.code == 2 and "--layers 0: at least 1" in capsys.readouterr().err


def test_step_bytes_count_touched_experts_and_the_cache(golden_dir):
    config, _, _ = bench.shape_config(str(golden_dir), None, None)
    model = bench.random_weights(config, torch.device("cpu"), torch.float32, 0)
    all_touched = [config.num_experts] * (config.num_hidden_layers - config.first_k_dense_replace)
    everything = sum(p.numel() * 4 for p in model.parameters()) - model.model.word_embeddings.weight.numel() * 4
    kv = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * (64 + 32) * 4
    assert bench.step_bytes(model, all_touched, 1, 64)[0] == everything + kv
    one_each = bench.step_bytes(model, [1] * len(all_touched), 1, 64)[0]
    expert = 3 * config.moe_intermediate_size * config.hidden_size * 4
    assert everything + kv - one_each == len(all_touched) * (config.num_experts - 1) * expert


def test_step_bench_profile_and_refusals(golden_dir, capsys):
    args = ["--shape", str(golden_dir), "--device", "cpu", "--dtype", "float32", "--context", "32", "--iters", "1"]
    assert bench.bench_main([*args, "--profile"]) == 0
    out = capsys.readouterr().out
    assert "top ops" in out and "aten::" in out
    assert [r[0] for r in table(out)] == ["3 of 3"]  # the full depth: nothing projected
    with pytest.raises(SystemExit, match="cuda-graph needs --device cuda"):
        bench.bench_main([*args, "--cuda-graph"])
    with pytest.raises(SystemExit, match="whole number"):
        bench.bench_main([*args[:-4], "--context", "40"])


def test_step_bench_of_llada22_routes_per_block_and_ranks_the_edit_candidates(capsys, monkeypatch):
    """A LLaDA2.2 shape: every MoE layer, the projected one too, takes block routing, and the step ends
    in the InDel rule's device part (each position's ranked candidates), not JointThreshold's."""
    from llada_lsp.model import llada2

    tiny22 = CONFIGS.parent.parent / "golden" / "llada22-tiny" / "config.json"
    seen, ranked = [], []
    routed = llada2.SparseMoE.forward
    monkeypatch.setattr(
        llada2.SparseMoE, "forward", lambda self, x, blocks=None: (seen.append(blocks), routed(self, x, blocks))[1]
    )
    candidates = bench.indel_candidates
    monkeypatch.setattr(bench, "indel_candidates", lambda logits: (ranked.append(logits.shape), candidates(logits))[1])
    assert bench.bench_main(["--shape", str(tiny22), "--device", "cpu", "--dtype", "float32", "--layers", "1",
                             "--context", "64", "--iters", "2", "--peak-gbs", "10"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert [r[0] for r in table(out)] == ["2 of 3", "3 (projected)"]
    assert "block routing 8 of 16" in out and "InDel candidates" in out
    assert seen and all(blocks is not None for blocks in seen) and ranked


# --- the CPU step against its matmul floor (bench_floor.py) -----------------------------------------
def test_the_floor_counts_the_steps_arithmetic():
    """The floor's GEMMs of a 32-query step are the model's multiply-adds, counted by hand: per layer
    QKV, the attention's two matmuls over S keys, the output projection, then the dense MLP or the
    router, each routed expert at its tokens and the shared expert; the lm_head over decided rows."""
    from llada_lsp.commands.bench_floor import StepShape, gemms

    model = load_model(None, device="cpu", dtype=torch.float32)
    c = model.config
    C, I, Ie, E = c.hidden_size, c.intermediate_size, c.moe_intermediate_size, c.num_experts
    routed = tuple((8, 0, 16, 0, 24, 0, 16, 0) for _ in range(c.num_hidden_layers - 1))
    shape = StepShape(B=1, T=32, S=480, R=32, routed=routed)
    macs = 0
    weights = {id(p) for p in model.parameters()}
    for kind, a, b in gemms(model, shape):
        assert a[-1] == b.shape[-1] if isinstance(b, torch.Tensor) else a[-1] == b[-1]  # [.., k] x [.., out, k]^T
        out = b.shape[0] if isinstance(b, torch.Tensor) else b[-2]
        macs += (a[0] if kind == "bmm" else 1) * a[-2] * a[-1] * out
        # the model's own weights (or a view into its stacked experts), so the floor reads what the step reads
        assert not isinstance(b, torch.Tensor) or id(b) in weights or id(b._base) in weights
    attention = 32 * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim * C + 32 * C * C  # H * D = C here
    attention += 2 * c.num_attention_heads * 32 * c.head_dim * 480
    dense = 3 * 32 * C * I
    moe = 32 * C * E + 3 * (8 + 16 + 24 + 16) * C * Ie + 3 * 32 * C * Ie * c.num_shared_experts
    assert macs == c.num_hidden_layers * attention + dense + (c.num_hidden_layers - 1) * moe + 32 * C * c.vocab_size


@pytest.mark.slow
def test_the_floor_bench_prints_and_publishes_both_cases(capsys, tmp_path, restore_threads):
    assert bench.bench_main(["--floor", "--threads", "1", "--reps", "1", "--repeat", "1",
                             "--markdown", str(tmp_path / "floor.md")]) == 0  # fmt: skip
    rows = table(capsys.readouterr().out)
    assert [r[:2] for r in rows] == [["1", "cold block"], ["1", "draft checked ahead"]]
    cold, ahead = rows
    assert cold[3:5] == ["32", "32"] and int(ahead[4]) > 32  # a draft's forward decides several blocks
    for row in rows:
        step, floor, ratio = float(row[5]), float(row[6]), float(row[7].rstrip("x"))
        assert floor > 0 and step > 0 and abs(ratio - step / floor) < 0.01
        # ops per step: at least the GEMMs and the attention of 4 layers, far fewer than one per query
        assert 4 * 4 < float(row[8]) < 2000
    assert table((tmp_path / "floor.md").read_text()) == rows
