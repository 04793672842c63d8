"""`llada-lsp bench`: the cached engine against the recompute-everything loop (the reference algorithm),
side by side in one run, on a random checkpoint of the LLaDA2 architecture; with `--shape`, one
denoising step at a real model's shapes against the memory-bandwidth floor; with `--floor`, the CPU step
of the embedded model against its matmul floor (bench_floor.py).

Knows the model and the engine's step rule, never the LSP. The random network of the engine comparison
gets a golden-style lm_head (noise plus each token's own embedding direction) so that unmasked positions
predict themselves and blocks settle as a trained model's do; without it every step would fill one
token and both engines would only measure fallback steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import kernels
from ..engine import PRESETS, Engine, GenerationResult
from ..engine.policy import indel_candidates, joint_threshold
from ..model import BlockKVCache, LLaDA2, LLaDA2Config, fp8
from ..model.llada2 import RoutingBlocks, rope_cos_sin
from ..model.loader import tensor_dtype
from ..report import Report, Table, add_markdown_argument

# About 50M parameters: 8 layers, hidden 512, 12 experts of 256 (top 2) plus a shared one.
BENCH_CONFIG = dict(
    vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    head_dim=64, intermediate_size=1536, moe_intermediate_size=256, num_experts=12, num_experts_per_tok=2,
    num_shared_experts=1, n_group=4, topk_group=2, max_position_embeddings=4096,
    mask_token_id=8191, eos_token_id=8188,
)  # fmt: skip


def random_model(seed: int = 0) -> LLaDA2:
    torch.manual_seed(seed)
    model = LLaDA2(LLaDA2Config(**BENCH_CONFIG))
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if not name.endswith("expert_bias") else p.normal_(0, 0.1)
            else:
                p.normal_(0, p.shape[-1] ** -0.5)
        emb = model.model.word_embeddings.weight
        emb.normal_(0, 1)
        head = 5 / cfg.hidden_size**0.5 * torch.randn_like(model.lm_head.weight) + 2 * emb / emb.norm(
            dim=-1, keepdim=True
        )
        head[cfg.mask_token_id] *= 0.1
        model.lm_head.weight.copy_(head)
    return model.eval().requires_grad_(False)


def run(
    engine: Engine, prompt: list[int], gen_length: int, mode: str, progress: tqdm | None = None
) -> GenerationResult:
    """One generation; each of its steps counted on `progress` (a bar on stderr, or None)."""
    generation = engine.generation(prompt, gen_length, mode, eos_early_stop=False)
    for _ in generation:
        if progress is not None:
            progress.update()
    return generation.result


def engines(model: LLaDA2) -> tuple[Engine, Engine]:
    """(the cached engine, the recompute loop). The cached engine keeps no prefix cache: a run reuses
    no block of an earlier one (the warm-up's), so each timed run pays its whole prefill."""
    return Engine(model, prefix_cache=False), Engine(model, use_cache=False)


def compare(
    cached: Engine, baseline: Engine, prompt: list[int], gen_length: int, mode: str, progress: tqdm | None = None
) -> tuple[GenerationResult, GenerationResult, float]:
    """Both engines on one prompt, the cached one after a warm-up on the prompt's first 64 tokens ->
    (cached result, recompute result, recompute seconds). `progress`: a bar that counts their steps."""

    def phase(name: str) -> tqdm | None:
        if progress is not None:
            progress.set_description(f"prompt {len(prompt)}, {name}")
        return progress

    run(cached, prompt[:64], 32, mode, phase("warm-up"))
    a = run(cached, prompt, gen_length, mode, phase("cached"))
    t = time.perf_counter()
    b = run(baseline, prompt, gen_length, mode, phase("recompute"))
    return a, b, time.perf_counter() - t


def bench_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--shape" or a.startswith("--shape=") for a in argv):
        return step_main(argv)
    if "--floor" in argv:
        from .bench_floor import floor_main

        return floor_main(argv)
    ap = argparse.ArgumentParser(prog="llada-lsp bench", description=__doc__.split("\n\n")[0],
                                 epilog="With --shape: one denoising step at a real model's shapes "
                                        "(`llada-lsp bench --shape llada2.1-mini --help`). With --floor: the "
                                        "CPU step of the embedded model against its matmul floor "
                                        "(`llada-lsp bench --floor --help`).")  # fmt: skip
    ap.add_argument("--prompt-lengths", default="256,1024,2048", help="comma-separated prompt lengths")
    ap.add_argument("--gen-length", type=int, default=64, help="tokens generated per run (default: 64)")
    ap.add_argument("--mode", default="speed", choices=list(PRESETS), help="decoding preset (default: speed)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random checkpoint and prompts (default: 0)")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_model(args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    caption = (f"Random LLaDA2 checkpoint: {n_params / 1e6:.1f}M parameters, {model.config.num_hidden_layers} layers, "
               f"{model.config.num_experts} experts top-{model.config.num_experts_per_tok}; CPU, float32, "
               f"{torch.get_num_threads()} threads; mode {args.mode}, gen_length {args.gen_length}.")  # fmt: skip
    print(caption)
    cached, baseline = engines(model)
    gen = torch.Generator().manual_seed(args.seed)
    table = Table(["prompt", "steps", "tokens/forward", "cached tokens/s", "recompute tokens/s", "speedup",
                   "same tokens"])  # fmt: skip
    print(table.markdown(), flush=True)  # the header; each row as it is measured (the longest prompts take a while)
    # Meanwhile the steps count on stderr, at a terminal only (tqdm's disable=None): a recompute run of the
    # longest prompts sat silent for tens of seconds.
    progress = tqdm(desc="steps", unit=" steps", leave=False, disable=None, file=sys.stderr)
    for length in (int(x) for x in args.prompt_lengths.split(",")):
        prompt = torch.randint(0, model.config.vocab_size - 8, (length,), generator=gen).tolist()
        a, b, t = compare(cached, baseline, prompt, args.gen_length, args.mode, progress)
        n = len(a.tokens)
        table.add(length, f"{a.steps} (+{a.prefill_forwards} prefill)", f"{a.tokens_per_forward:.2f}",
                  f"{n / a.seconds:.1f}", f"{n / t:.1f}", f"{t / a.seconds:.1f}x", a.tokens == b.tokens)  # fmt: skip
        progress.write(table.markdown().splitlines()[-1], file=sys.stdout)  # the bar cleared, the row, the bar again
        sys.stdout.flush()
    progress.close()
    if args.markdown:
        report = Report("Speed: the cached engine against recompute-everything")
        report.table(table, caption + " Both engines run side by side in one run; each timed run pays its own "
                     "prefill (no prefix cache).")  # fmt: skip
        report.write(args.markdown)
    return 0


# --- one denoising step at a real model's shapes ----------------------------------------------------
# What differs from LLaDA2Config's defaults (LLaDA2.1-mini); tests/commands/test_bench.py holds these to the
# real config.json files. tokens_per_forward: the LLaDA2.1 paper's average, to project tokens/s (None:
# LLaDA2.2's report gives none). LLaDA2.2-flash: the flash shapes, block routing (48 experts per 32-token
# block), 128K positions (../shared/LLADA22.md); its edit ids are the flash defaults (model/family.py).
FLASH = dict(hidden_size=4096, intermediate_size=9216, moe_intermediate_size=1024, num_attention_heads=32,
             num_hidden_layers=32)  # fmt: skip
SHAPES: dict[str, tuple[dict, float | None]] = {
    "llada2.1-mini": ({}, 12.3),
    "llada2.1-flash": (FLASH, 13.8),
    "llada2.2-flash": (dict(FLASH, block_size=32, expert_capacity=48, max_position_embeddings=131072,
                            rope_theta=3e6), None),
}  # fmt: skip
SPECIAL_IDS = dict(mask_token_id=156895, eos_token_id=156892, pad_token_id=156892)
# Peak memory bandwidth (GB/s) by a fragment of torch.cuda.get_device_name(); --peak-gbs overrides.
PEAK_GBS = {"H200": 4800, "H100": 3350, "H800": 3350, "A100": 2039, "L40S": 864, "L4": 300, "4090": 1008}
BLOCK = 32  # queries per block


def shape_config(shape: str, layers: int | None, quantize: str | None) -> tuple[LLaDA2Config, int, float | None]:
    """A named shape or a config.json path -> (config with `layers` layers, the full depth, paper tokens
    per forward). At least one MoE layer is built, so a one-layer run still times the experts."""
    if shape in SHAPES:
        overrides, tpf = SHAPES[shape]
        config = LLaDA2Config(**SPECIAL_IDS, **overrides)
    else:
        path = Path(shape)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise SystemExit(f"--shape {shape!r}: neither {' nor '.join(SHAPES)} nor a config.json")
        config, tpf = LLaDA2Config(**json.loads(path.read_text())), None
    full = config.num_hidden_layers
    config.num_hidden_layers = min(full, max(layers or full, config.first_k_dense_replace + 1))
    if quantize == "fp8":
        config.quantization_config = dict(fp8.QUANTIZATION_CONFIG)
    return config, full, tpf


def layers_note(asked: int, config: LLaDA2Config, full: int) -> str:
    """Why the network built has another depth than `--layers` asked for: one line for stderr."""
    built = config.num_hidden_layers
    if asked > full:
        return f"llada-lsp bench: --layers {asked}: the shape has {full} layers; building {built}"
    dense = config.first_k_dense_replace
    return (f"llada-lsp bench: --layers {asked}: building {built}, since the first {dense} "
            f"{'is' if dense == 1 else 'are'} dense and one MoE layer is needed to time the experts")  # fmt: skip


def random_weights(config: LLaDA2Config, device: torch.device, dtype: torch.dtype, seed: int) -> LLaDA2:
    """The network at `config`'s shapes with random weights, made on the device (nothing on the host),
    FP8 experts as FP8 with block scales; routing by random router weights touches experts as a block
    of code does (~160 of 256 per layer at mini shapes)."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LLaDA2(config)
    state = {}
    for name, p in model.named_parameters():
        held = tensor_dtype(name, dtype, p.dtype)
        if held == fp8.FP8:  # one expert at a time: the float draw of a whole layer would double its size
            t = torch.empty(p.shape, dtype=held, device=device)
            for e in range(p.shape[0]):
                t[e] = (torch.randn(p.shape[1:], device=device) * 100).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(held)
        elif name.endswith("_scale_inv"):
            t = torch.full(p.shape, 0.02 / 100, dtype=held, device=device)
        elif p.dim() == 1:
            t = torch.randn(p.shape, dtype=held, device=device) * 0.01 + (0 if name.endswith("expert_bias") else 1)
        else:
            t = torch.randn(p.shape, dtype=held, device=device) * 0.02
        state[name] = t
    model.load_state_dict(state, assign=True)
    return model.eval().requires_grad_(False)


def step_bytes(model: LLaDA2, touched: list[int], batch: int, context: int) -> tuple[int, int]:
    """Bytes one step must read -> (all of them, one MoE layer's on average): every layer's attention
    and norms, the dense MLPs, the routers, shared experts and the experts the block touched (with
    their scales), the K/V cache up to the block, the final norm and lm_head."""
    per_moe, total = [], 0
    touched_by_moe_layer = iter(touched)  # one count per MoE layer, in order
    for layer in model.model.layers:
        mlp = layer.mlp
        n = sum(p.nbytes for p in layer.parameters())
        if hasattr(mlp, "experts"):
            experts = sum(p.nbytes for p in mlp.experts.parameters())
            n += experts * (next(touched_by_moe_layer) / mlp.experts.w_gate.shape[0] - 1)
            per_moe.append(n)
        total += n
    c = model.config
    kv = 2 * c.num_key_value_heads * c.head_dim * (context + BLOCK) * model.dtype.itemsize * batch
    total += c.num_hidden_layers * kv + model.lm_head.weight.nbytes + model.model.norm.weight.nbytes
    return int(total), int(sum(per_moe) / max(1, len(per_moe))) + kv


def count_touched(model: LLaDA2, step) -> list[int]:
    """Distinct experts each MoE layer routes the step's tokens to (one extra step, hooks removed after)."""
    touched, hooks = [], []
    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(lambda m, i, out: touched.append(len(out[0].unique()))))
    try:
        step()
    finally:
        for h in hooks:
            h.remove()
    return touched


def timed(fn, iters: int, device: torch.device, graph: bool) -> float:
    """ms per call of `fn`, after warm-up (compiles the Triton kernels); `graph`: replayed from one
    CUDA graph of it, static shapes and addresses."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    for _ in range(2):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t) / iters * 1000


def print_profile(fn, device: torch.device, rows: int = 20) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()  # warm
    with profile(activities=activities) as prof:
        for _ in range(3):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"top ops of 3 steps (torch.profiler, by {key}):")
    print(prof.key_averages().table(sort_by=key, row_limit=rows))


def peak_gbs(device: torch.device, override: float | None) -> float | None:
    if override or device.type != "cuda":
        return override
    name = torch.cuda.get_device_name(device)
    return next((gbs for part, gbs in PEAK_GBS.items() if part in name), None)


def step_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp bench --shape", description=(
        "ms per denoising step (one block of 32 queries per row against --context cached tokens, then the "
        "step rule) at a real model's shapes with random weights: achieved GB/s, the ratio to the "
        "memory-bandwidth floor, tokens/s at the paper's tokens per forward."))  # fmt: skip
    ap.add_argument("--shape", required=True, help=f"{' | '.join(SHAPES)} | a config.json (or its folder)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--layers", type=int, default=None, help="build the first N layers and project the full depth (at least the dense ones and one MoE "
                         "layer, at most the shape's: another number is said on stderr)")  # fmt: skip
    ap.add_argument("--quantize", choices=["fp8"], default=None, help="routed experts in FP8 with 128x128 scales")
    ap.add_argument("--batch", type=int, default=1, help="blocks per step, one per sequence (default: 1)")
    ap.add_argument("--context", type=int, default=1024, help="cached tokens before the block (default: 1024)")
    ap.add_argument("--iters", type=int, default=20, help="timed steps (default: 20)")
    ap.add_argument("--cuda-graph", action="store_true", help="replay each timed step from one CUDA graph")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of a step")
    ap.add_argument("--peak-gbs", type=float, default=None, help="the device's memory bandwidth (default: by name)")
    ap.add_argument("--seed", type=int, default=0)
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device on this machine")
    if args.cuda_graph and device.type != "cuda":
        raise SystemExit("--cuda-graph needs --device cuda")
    if args.context % BLOCK:
        raise SystemExit(f"--context {args.context}: a whole number of {BLOCK}-token blocks")
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers {args.layers}: at least 1")
    config, full, tpf = shape_config(args.shape, args.layers, args.quantize)
    if args.layers is not None and args.layers != config.num_hidden_layers:
        print(layers_note(args.layers, config, full), file=sys.stderr, flush=True)
    dtype = getattr(torch, args.dtype)
    model = random_weights(config, device, dtype, args.seed)
    B, S = args.batch, args.context
    cache = BlockKVCache(config, S + BLOCK, device, dtype, batch=B)
    cache.k.normal_()
    cache.v.normal_()
    gen = torch.Generator(device=device).manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size - 8, (B, BLOCK), device=device, generator=gen)  # [B, T]
    ids[:, BLOCK // 2 :] = config.mask_token_id  # half the block still masked
    frozen = torch.zeros(B, BLOCK, dtype=torch.bool, device=device)
    mask_ids = torch.full((B,), config.mask_token_id, device=device)
    fill_above, edit_above = (torch.full((B,), v, device=device) for v in (PRESETS["speed"].threshold, 0.0))
    indel = config.edit_ids is not None  # LLaDA2.2: the device's part of its rule, the rest is on the host
    fused_rule = not indel and kernels.enabled(torch.empty(0, dtype=dtype, device=device))

    def step():
        logits = model(ids, cache=cache, start=S, last_n=BLOCK)  # [B, T, V]
        if indel:
            return indel_candidates(logits)
        if fused_rule:
            return kernels.step(ids, logits, frozen, mask_ids, fill_above, edit_above)
        return joint_threshold(ids, logits, frozen, mask_ids, fill_above.tolist(), edit_above.tolist())

    # One MoE layer alone, on the same inputs, for the projection to the full depth.
    last = model.model.layers[-1]
    x = torch.randn(B, BLOCK, config.hidden_size, device=device, dtype=dtype, generator=gen)
    cos, sin = rope_cos_sin(torch.arange(S, S + BLOCK, device=device), config.rotary_dim, config.rope_theta, dtype)
    routing = (
        RoutingBlocks.of(torch.arange(S, S + BLOCK, device=device), None, B, BLOCK) if config.block_routing else None
    )

    def one_layer():
        return last(x, cos, sin, None, cache.at(S, BLOCK), routing)

    # the torch JointThreshold rule builds tensors from lists: not capturable; InDel's candidates are
    graph = bool(args.cuda_graph and (fused_rule or indel))
    if args.cuda_graph and not graph:
        print("--cuda-graph: the step rule's kernels are off (no triton, or LLADA_LSP_KERNELS=0): timing without")
    with torch.inference_mode():
        touched = count_touched(model, step)
        if args.profile:
            print_profile(step, device)
        ms = timed(step, args.iters, device, graph)
        layer_ms = timed(one_layer, args.iters, device, graph) if config.num_hidden_layers < full else 0.0
    total, per_layer = step_bytes(model, touched, B, S)
    extra = full - config.num_hidden_layers
    peak = peak_gbs(device, args.peak_gbs)
    moe = last.mlp.mode(x)  # SparseMoE's own rule: the Experts path this step's blocks take
    moe = "fused (Triton)" if moe == "fused" else moe
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rule = (
        "InDel candidates (torch; the rule runs on the host)" if indel else "fused (Triton)" if fused_rule else "torch"
    )
    routing_note = f", block routing {config.expert_capacity} of {config.num_experts}" if config.block_routing else ""
    caption = (f"{args.shape}: {name}, {args.dtype}{', FP8 experts' if args.quantize else ''}, MoE {moe}{routing_note}, "
               f"step rule {rule}, {'CUDA graph' if graph else 'eager'}; batch {B} x {BLOCK} "
               f"queries, context {S}; experts touched per layer: {min(touched)}-{max(touched)} of {config.num_experts}; "
               f"peak {f'{peak:.0f} GB/s' if peak else 'unknown (--peak-gbs)'}")  # fmt: skip
    table = Table(["layers", "ms/step", "GB read/step", "GB/s", "of peak", "floor ms", "x floor",
                   "tok/s at paper tok/forward"])  # fmt: skip
    rows = [(f"{config.num_hidden_layers} of {full}", ms, total)]
    if extra:
        rows.append((f"{full} (projected)", ms + extra * layer_ms, total + extra * per_layer))
    for label, t, nbytes in rows:
        gbs = nbytes / t / 1e6
        floor = nbytes / peak / 1e6 if peak else None
        table.add(label, f"{t:.2f}", f"{nbytes / 1e9:.3g}", f"{gbs:.0f}", f"{gbs / peak:.0%}" if peak else "-",
                  f"{floor:.2f}" if floor else "-", f"{t / floor:.1f}x" if floor else "-",
                  f"{B * tpf * 1000 / t:.0f}" if tpf else "-")  # fmt: skip
    print(caption, table.markdown(), sep="\n", flush=True)
    if args.markdown:
        report = Report(f"One denoising step at {args.shape} shapes")
        report.table(table, caption + ".")
        report.write(args.markdown)
    return 0
