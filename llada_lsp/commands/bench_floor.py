"""`llada-lsp bench --floor`: the CPU denoising step against its matmul floor, the time of the step's own
GEMMs alone at the same shapes, for a cold block and for a draft checked ahead, at 1 and 2 threads.

Knows the model's shapes and the engine's public API (a generation is a generator of steps), never the
LSP. The floor is counted from the arithmetic of each timed step (its queries, keys and decided rows,
and the experts its router chose), not from whatever the implementation happens to run, so a step that
multiplied more than it needs to would not raise its own floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..engine import Engine
from ..model import LLaDA2, load_model
from ..report import Report, Table, add_markdown_argument

COLD_PROMPT = 416  # whole blocks; with 64 generated tokens, the measure (480 of 512 positions)
AHEAD_PROMPT = 320  # with a 160-token draft: the embedded model's 512 positions
AHEAD_DRAFT = 160


@dataclass(frozen=True)
class StepShape:
    """What one denoising forward multiplies: B rows of T queries against S keys, R decided rows (the
    lm_head's), and per MoE layer the tokens each routed expert took."""

    B: int
    T: int
    S: int
    R: int
    routed: tuple[tuple[int, ...], ...]  # [MoE layer][expert] token counts


Operand = tuple[int, ...] | torch.Tensor  # a shape (made at random), or the model's own weight [out, in]


def gemms(model: LLaDA2, shape: StepShape) -> list[tuple[str, tuple[int, ...], Operand]]:
    """The step's matmuls as ("mm" | "bmm", a's shape, b): b is the model's own weight where the step
    multiplies one (read as the step reads it, so the floor pays the same memory traffic: [out, in]'s
    transpose, which cpu_runner.layout stores contiguous), else the shape [.., out, in] of the attention's keys
    or values. The routed experts' gate and up count as two GEMMs each, as the arithmetic is, though the
    step runs them as one grouped GEMM over all experts."""
    c = model.config
    H, D = c.num_attention_heads, c.head_dim
    B, T, S = shape.B, shape.T, shape.S
    N = B * T
    out: list[tuple[str, tuple[int, ...], Operand]] = []
    routed = iter(shape.routed)

    def linear(rows: int, weight: torch.Tensor) -> None:
        out.append(("mm", (rows, weight.shape[1]), weight))

    for layer in model.model.layers:
        attention = layer.attention
        linear(N, attention.query_key_value.weight)
        out.append(("bmm", (B * H, T, D), (B * H, S, D)))  # scores: q k^T
        out.append(("bmm", (B * H, T, S), (B * H, D, S)))  # the values' weighted sum: p v
        linear(N, attention.dense.weight)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            linear(N, mlp.gate.weight)  # the router
            experts = mlp.experts
            for e, n in enumerate(next(routed)):
                if n:
                    linear(n, experts.w_gate[e])
                    linear(n, experts.w_up[e])
                    linear(n, experts.w_down[e])
            mlp = mlp.shared_experts
        if mlp is not None:
            linear(N, mlp.gate_proj.weight)
            linear(N, mlp.up_proj.weight)
            linear(N, mlp.down_proj.weight)
    linear(shape.B * shape.R, model.lm_head.weight)  # over the decided rows only
    return out


class Floor:
    """Times a step's GEMMs alone: activations made once per shape, the model's weights read in place,
    results written into preallocated outputs, the list run as one call and timed as the step is (wall
    clock, median of `repeat`)."""

    def __init__(self, model: LLaDA2, repeat: int):
        self.model, self.repeat = model, repeat
        self.tensors: dict[tuple, torch.Tensor] = {}
        self.gen = torch.Generator().manual_seed(0)

    def _random(self, *key) -> torch.Tensor:
        if key not in self.tensors:
            self.tensors[key] = torch.randn(key[1:], generator=self.gen)
        return self.tensors[key]

    def _call(self, kind: str, a: tuple[int, ...], b: Operand):
        x = self._random("a", *a)
        w = (b if isinstance(b, torch.Tensor) else self._random("b", *b)).transpose(-1, -2)  # [.., in, out]
        key = ("out", *a[:-1], w.shape[-1])
        if key not in self.tensors:
            self.tensors[key] = torch.empty(key[1:])
        return torch.mm if kind == "mm" else torch.bmm, x, w, self.tensors[key]

    def ms(self, shape: StepShape) -> float:
        calls = [self._call(*g) for g in gemms(self.model, shape)]
        times = []
        with torch.inference_mode():
            for _ in range(self.repeat):
                t = time.perf_counter()
                for op, x, w, out in calls:
                    op(x, w, out=out)
                times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000


class StepRecorder:
    """Hooks on the model that note each forward's StepShape (its keys from the engine's view, the
    routed experts from each router's choice), adding no op to the timed step; removed by `close`."""

    def __init__(self, model: LLaDA2):
        self.E = model.config.num_experts
        # per forward: (B, T, S, R) and each MoE layer's expert ids, counted after the timed steps
        self._raw: list[tuple[tuple[int, int, int, int], list[torch.Tensor]]] = []
        self.hooks = [model.register_forward_pre_hook(self._start, with_kwargs=True),
                      model.register_forward_hook(self._end)]  # fmt: skip
        self.moe = [layer for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.runner = model.runner  # the CPU runner's flat layers call no router module (model/cpu_runner.py)
        for layer in self.moe:
            self.hooks.append(layer.mlp.gate.register_forward_hook(lambda m, i, out: self._raw[-1][1].append(out[0])))

    def _end(self, model, args, out) -> None:
        """A forward that ran the CPU runner called no router module: its layers' routing instead."""
        if not self._raw[-1][1] and self.runner is not None:
            flat = self.runner.layers
            self._raw[-1][1].extend(torch.from_numpy(flat[layer.attention.layer_idx].expert_ids) for layer in self.moe)

    def _start(self, model, args, kwargs) -> None:
        B, T = args[0].shape
        kv, last_n = kwargs.get("kv"), kwargs.get("last_n")
        S = kv.reads.shape[1] if kv is not None and getattr(kv, "reads", None) is not None else T
        self._raw.append(((B, T, S, T if last_n is None else last_n), []))

    @property
    def shapes(self) -> list[StepShape]:
        """The denoising forwards' shapes (a prefill, last_n=0, is no denoising step)."""
        return [StepShape(*dims, tuple(tuple(torch.bincount(ids.flatten(), minlength=self.E).tolist()) for ids in routed))
                for dims, routed in self._raw if dims[3]]  # fmt: skip

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()


@dataclass
class Timed:
    ms: list[float]  # each timed step, wall clock, the engine's whole step (host work included)
    floor: list[float]  # each timed step's GEMMs alone
    queries: list[int]
    decided: list[int]


def time_steps(engine: Engine, settings, reps: int, floor: Floor, keep) -> Timed:
    """`reps` generations of `settings` after a warm-up one, which also caches the prompt's blocks (no
    timed step pays a prefill); each step timed from the last one's end, kept where `keep(shape)`."""
    engine.generation(**settings).run()
    timed = Timed([], [], [], [])
    for _ in range(reps):
        recorder = StepRecorder(engine.model)
        ms = []
        try:
            gen = engine.generation(**settings)
            t = time.perf_counter()
            for _ in gen:
                now = time.perf_counter()
                ms.append((now - t) * 1000)
                t = now
        finally:
            recorder.close()
        shapes = recorder.shapes
        if gen.result.prefill_forwards or len(ms) != len(shapes):
            raise RuntimeError("a timed generation ran a prefill: the prompt's blocks were not cached")
        for step_ms, shape in zip(ms, shapes):
            if keep(shape):
                timed.ms.append(step_ms)
                timed.floor.append(floor.ms(shape))
                timed.queries.append(shape.T)
                timed.decided.append(shape.R)
    return timed


# What `tensor.numpy()` dispatches under a TorchDispatchMode (a numba kernel's arguments): no work, not counted
NUMPY_VIEW = {torch.ops.aten.detach.default, torch.ops.aten.resolve_conj.default, torch.ops.aten.resolve_neg.default,
              torch.ops.aten.to.dtype_layout}  # fmt: skip


class OpCounter(TorchDispatchMode):
    """Counts the ops torch dispatches (views included, a numpy view for a CPU kernel not): what the step
    pays besides arithmetic. A numba kernel's call is not a torch op and is not counted."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func not in NUMPY_VIEW
        return func(*args, **(kwargs or {}))


def ops_per_step(engine: Engine, settings, keep) -> float:
    """The mean dispatched ops of the steps `keep` takes, over one untimed generation of `settings`
    (its prompt blocks cached, as in time_steps)."""
    recorder, counter, counts = StepRecorder(engine.model), OpCounter(), []
    try:
        steps = iter(engine.generation(**settings))
        with counter:
            while True:
                before = counter.n
                if next(steps, None) is None:
                    break
                counts.append(counter.n - before)
    finally:
        recorder.close()
    kept = [n for n, shape in zip(counts, recorder.shapes) if keep(shape)]
    return statistics.mean(kept) if kept else float("nan")


def floor_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp bench --floor", description=(
        "The CPU denoising step of a model (default: the embedded one) against its matmul floor: the "
        "same GEMMs at the same shapes alone (the attention's two included), timed the same way, and "
        "their ratio; for a cold block (one block of 32 queries) and for a draft checked ahead (the "
        "blocks one forward decides), at each thread count."))  # fmt: skip
    ap.add_argument(
        "--floor", action="store_true", required=True, help="this table (rather than the engine comparison)"
    )
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default: 1,2)")
    ap.add_argument("--reps", type=int, default=5, help="timed generations per case (default: 5)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each step's GEMMs, their median (default: 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and the draft (default: 0)")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    model = load_model(args.model, device="cpu", dtype=torch.float32)
    c = model.config
    if c.max_position_embeddings < COLD_PROMPT + 64 or c.max_position_embeddings < AHEAD_PROMPT + AHEAD_DRAFT:
        raise SystemExit(f"--model: {c.max_position_embeddings} positions; the cases need {COLD_PROMPT + 64}")
    gen = torch.Generator().manual_seed(args.seed)
    words = c.vocab_size - 8  # ordinary ids, away from the special ones at either end

    def ids(n: int) -> list[int]:
        return (torch.randint(8, words, (n,), generator=gen)).tolist()

    cold = dict(prompt_ids=ids(COLD_PROMPT), gen_length=64, policy="speed")
    ahead = dict(prompt_ids=ids(AHEAD_PROMPT), gen_length=AHEAD_DRAFT, policy="speed", init_ids=ids(AHEAD_DRAFT))
    bs = 32
    cases = [("cold block", cold, lambda s: bs == s.R), ("draft checked ahead", ahead, lambda s: bs < s.R)]
    table = Table(["threads", "case", "steps timed", "queries", "decided rows", "step ms p50", "floor ms p50",
                   "step / floor", "ops per step"])  # fmt: skip
    caption = (f"{'the embedded model' if args.model is None else args.model}: {c.num_hidden_layers} layers, hidden "
               f"{c.hidden_size}, {c.num_experts} experts top-{c.num_experts_per_tok} + {c.num_shared_experts} shared, "
               f"vocab {c.vocab_size}; CPU, float32, mode speed; cold: a {COLD_PROMPT}-token prompt, 64 tokens; "
               f"ahead: a {AHEAD_PROMPT}-token prompt and a {AHEAD_DRAFT}-token random draft, the steps that decide "
               f"more than one block; prompt blocks cached (no timed step pays a prefill); {args.reps} generations "
               f"per case, each step's GEMMs run {args.repeat} times")  # fmt: skip
    print(caption)
    print(table.markdown(), flush=True)
    before = torch.get_num_threads()
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            floor = Floor(model, args.repeat)
            for name, settings, keep in cases:
                engine = Engine(model)
                t = time_steps(engine, settings, args.reps, floor, keep)
                if not t.ms:
                    raise SystemExit(f"{name}: no step of that kind ran")
                step, bottom = statistics.median(t.ms), statistics.median(t.floor)
                ops = ops_per_step(engine, settings, keep)
                table.add(threads, name, len(t.ms), f"{statistics.mean(t.queries):.0f}",
                          f"{statistics.mean(t.decided):.0f}", f"{step:.2f}", f"{bottom:.2f}", f"{step / bottom:.2f}x",
                          f"{ops:.0f}")  # fmt: skip
                print(table.markdown().splitlines()[-1], flush=True)
    finally:
        torch.set_num_threads(before)
    if args.markdown:
        report = Report("The CPU denoising step against its matmul floor")
        report.table(table, caption + ". The floor: the step's own GEMMs (per layer the fused QKV projection, the "
                     "attention's scores and weighted sum, the output projection, the router, each routed expert at "
                     "the tokens it took, the shared expert or dense MLP; the lm_head over the decided rows) alone, "
                     "each on the model's own weights, with activations and outputs made beforehand at the "
                     "step's shapes (the weights stored as load_model keeps them on the CPU). Ops per step: the ops "
                     "torch dispatches in one such step, views included (not the numpy views a CPU kernel's "
                     "arguments take, nor the numba kernels' calls), counted in an untimed generation. Figures "
                     "measured while other work shared the machine are noisy.")  # fmt: skip
        report.write(args.markdown)
    return 0
