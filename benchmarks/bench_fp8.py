"""FP8 routed experts against bf16: per-row logits on the golden tiny checkpoint and on one random MoE
layer at the LLaDA2.1-mini shapes, and (with --infill N) first-line exact match of the embedded model.

Each row's error is the largest |logit difference| over the vocabulary, as tests/model/test_bf16.py measures
bf16 against float64; the bar printed beside the figures is the issue's: median < 0.5, at most 5% of rows
past 1.0, argmax agreement >= 0.9. Both models run bf16 everywhere but in the routed experts; the FP8
one goes through load_model(quantize="fp8") and the reference FP8 path (activations quantized per
token, weights per 128x128 tile), which computes on the CPU what the FP8 matmul computes on a GPU.

The random layer: embeddings ~ N(0, 1) (a residual stream of RMS ~1, as after a trained embedding),
every matrix ~ N(0, 0.02) (the checkpoints' initializer_range), the head scaled so that the bf16
logits have a standard deviation of --logit-std per row (a trained model's spread, not the tiny one
that N(0, 0.02) heads give: errors scale with it).

Usage: python benchmarks/bench_fp8.py [--tokens 64] [--vocab 157184] [--logit-std 4] [--infill 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from llada_lsp.model import LLaDA2, LLaDA2Config, load_model, save_model
from llada_lsp.report import Report, Table, add_markdown_argument

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "llada2-tiny"
MINI = ROOT / "tests" / "data" / "configs" / "llada2.1-mini.json"
GOLDEN_CASES = ("bc45", "bc64", "bc100_masks")  # the block-causal forward cases, as tests/model/test_bf16.py


def row_figures(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """logits, reference [R, V] -> median of the per-row max |error|, share of rows past 1.0, argmax agreement."""
    logits, reference = logits.double(), reference.double()
    err = (logits - reference).abs().max(-1).values
    return {"rows": len(err), "median": err.median().item(), "past_1": (err > 1.0).double().mean().item(),
            "argmax": (logits.argmax(-1) == reference.argmax(-1)).double().mean().item()}  # fmt: skip


def meets_bar(f: dict[str, float]) -> bool:
    return f["median"] < 0.5 and f["past_1"] <= 0.05 and f["argmax"] >= 0.9


def golden_figures(golden: Path = GOLDEN) -> dict[str, float]:
    from safetensors.torch import load_file

    bf16 = load_model(golden, device="cpu", dtype="bfloat16")
    fp8 = load_model(golden, device="cpu", dtype="bfloat16", quantize="fp8")
    tensors = load_file(golden / "forward.safetensors")
    ours, ref = [], []
    with torch.no_grad():
        for case in GOLDEN_CASES:
            ids = tensors[f"{case}.input_ids"][None]
            ours.append(fp8(ids)[0])
            ref.append(bf16(ids)[0])
    return row_figures(torch.cat(ours), torch.cat(ref))


def random_layer(raw: dict, folder: Path, logit_std: float, tokens: torch.Tensor, seed: int = 0) -> None:
    """One random MoE layer at `raw`'s shapes, written to `folder` in bf16 (see the module docstring)."""
    config = LLaDA2Config(**{**raw, "num_hidden_layers": 1, "first_k_dense_replace": 0})
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LLaDA2(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)  # never written in float32: ~3 GB at mini shapes
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("expert_bias"):
                p.zero_()
            else:
                p.normal_(0.0, 1.0 if "word_embeddings" in name else 0.02)
        model.lm_head.weight.mul_(logit_std / model(tokens)[0].float().std(-1).mean())
    save_model(model, folder, torch.bfloat16)


def random_layer_figures(raw: dict, tokens: int = 64, logit_std: float = 4.0, seed: int = 0) -> dict[str, float]:
    """FP8 against bf16 on one random MoE layer at `raw`'s shapes, `tokens` queries (block-causal)."""
    ids = torch.randint(0, raw["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(seed))
    with tempfile.TemporaryDirectory() as tmp:
        random_layer(raw, Path(tmp), logit_std, ids, seed)
        with torch.no_grad():
            ref = load_model(tmp, device="cpu", dtype="bfloat16")(ids)[0]
            ours = load_model(tmp, device="cpu", dtype="bfloat16", quantize="fp8")(ids)[0]
    return row_figures(ours, ref)


def infill_figures(n: int, seed: int = 1234) -> dict[str, dict]:
    """eval-infill's rest-of-line tasks, speed mode, the embedded model in bf16 and with FP8 experts:
    first-line exact match of each (eval_infill.score), and the task-by-task split between them."""
    from llada_lab.training.eval_infill import cut_to_unit, make_tasks, paired, score
    from llada_lsp.backends.native import NativeBatch
    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.completion.generation import LoadedModel, ModelSpec
    from llada_lsp.completion.jobs import Infill
    from llada_lsp.completion.pipeline import run_infill
    from llada_lsp.engine import Engine
    from llada_lsp.model import load_tokenizer

    tasks = [t for t in make_tasks(n, seed) if t.kind == "rest_of_line"]
    codec = TextCodec.from_tokenizer(load_tokenizer(None))
    answers, out = {}, {}
    for name, quantize in (("bf16", None), ("fp8", "fp8")):
        model = load_model(None, device="cpu", dtype="bfloat16", quantize=quantize)
        engine = Engine(model)
        loaded = LoadedModel(ModelSpec(None, "cpu", "bfloat16"), codec, model.config.max_position_embeddings,
                             engine.block_size, NativeBatch(engine))  # fmt: skip
        started, completions = time.time(), []
        for t in tasks:  # exactly what the server answers at this cursor, as eval-infill does
            job = Infill.at(t.prefix + t.suffix, len(t.prefix), "speed")
            answer = run_infill(loaded, job, threading.Event(), lambda *_: None)
            completions.append(cut_to_unit(t.kind, answer.text))
        answers[name] = completions
        out[name] = score(tasks, completions) | {"seconds": time.time() - started}
    only_bf16, only_fp8, p = paired(tasks, answers["bf16"], answers["fp8"])
    out["paired"] = {"only_bf16": only_bf16, "only_fp8": only_fp8, "sign_test_p": p}
    return out


def show(table: Table, label: str, f: dict[str, float]) -> None:
    verdict = "met" if meets_bar(f) else "missed"
    table.add(label, f"{f['median']:.2f}", f"{f['past_1']:.1%}", f"{f['argmax']:.1%}", verdict)
    print(f"{label}: {f['rows']} rows, median |error| {f['median']:.3f}, rows past 1.0 {f['past_1']:.1%}, "
          f"argmax agreement {f['argmax']:.1%}: {verdict} the bar")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="query tokens of the random layer (default: 64)")
    ap.add_argument("--vocab", type=int, default=None, help="cut the random layer's vocabulary (default: mini's)")
    ap.add_argument("--logit-std", type=float, default=4.0, help="the random layer's bf16 logit spread (default: 4)")
    ap.add_argument(
        "--infill",
        type=int,
        default=0,
        metavar="N",
        help="also score N rest-of-line tasks per model with eval-infill's tasks (default: 0, skip)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    table = Table(["model", "median error", "rows past 1.0", "argmax agreement", "the bf16 bar (< 0.5, <= 5%, >= 0.9)"])
    notes = []
    golden = golden_figures()
    show(table, f"the golden tiny checkpoint (64 wide, random), {golden['rows']} rows", golden)
    raw = json.loads(MINI.read_text())
    if args.vocab:  # the special ids must stay inside a cut vocabulary
        raw |= {"vocab_size": args.vocab, "mask_token_id": args.vocab - 1, "eos_token_id": args.vocab - 2,
                "pad_token_id": args.vocab - 2}  # fmt: skip
    started = time.time()
    layer = random_layer_figures(raw, args.tokens, args.logit_std)
    show(table, f"one random MoE layer at LLaDA2.1-mini shapes (vocab {raw['vocab_size']}), {layer['rows']} rows "
         f"({time.time() - started:.0f} s)", layer)  # fmt: skip
    if args.infill:
        figures = infill_figures(args.infill)
        for name in ("bf16", "fp8"):
            f = figures[name]
            notes.append(f"embedded model, {name}: rest-of-line first-line exact match {f['first_line_em']:.1%} of "
                         f"{f['n']} tasks (full {f['full_em']:.1%}, syntax-valid {f['syntax_ok']:.1%}, "
                         f"{f['seconds']:.0f} s)")  # fmt: skip
        split = figures["paired"]
        gap = figures["bf16"]["first_line_em"] - figures["fp8"]["first_line_em"]
        notes.append(f"FP8 vs bf16: {gap * 100:.1f} points lost (bar: within 2); right only in bf16 "
                     f"{split['only_bf16']}, only in fp8 {split['only_fp8']} (sign test p = {split['sign_test_p']:.2f})")  # fmt: skip
        print(*notes, sep="\n")
    if args.markdown:
        report = Report("FP8 experts against bf16")
        report.table(table, "Per-row max |logit error| against the same model in bf16, on the CPU (FP8 experts "
                     "dequantized per tile, activations quantized per token).")  # fmt: skip
        if notes:
            report.note("\n".join(f"- {line}" for line in notes))
        report.write(args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
