"""`llada-lsp generate`: decode one prompt with a checkpoint and print the completion and its speed.

How a user checks a checkpoint. Text prompts need the checkpoint's tokenizer; `--prompt-ids` does not.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..completion.generation import add_edit_ids_argument
from ..engine import PRESETS, Engine, JointThreshold, checks
from ..model import CheckpointError, load_model, load_tokenizer


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants comma-separated integers, got {text!r}") from None


def generate_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lsp generate", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default=None, help="model folder or Hugging Face id in the local cache (default: embedded)"
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (encoded with the checkpoint's tokenizer)")
    src.add_argument("--prompt-ids", type=parse_ids, help="prompt as token ids, e.g. 1,2,3")
    ap.add_argument("--mode", choices=[m for m in PRESETS], default="speed", help="threshold preset (default speed)")
    ap.add_argument("--threshold", type=float, help="mask-to-token threshold (overrides the mode)")
    ap.add_argument("--editing-threshold", type=float, help="token-to-token threshold (overrides the mode)")
    ap.add_argument("--gen-length", type=int, default=64, help="tokens to generate (default: 64)")
    ap.add_argument("--block-length", type=int, default=32, help="tokens per diffusion block (default: 32, as trained)")
    ap.add_argument("--max-post-steps", type=int, default=16,
                    help="editing steps allowed after a block has no masks left (default: 16)")  # fmt: skip
    ap.add_argument("--eos-early-stop", action="store_true", help="stop after the block that holds EOS")
    ap.add_argument("--mask-id", type=int, help="default: from the checkpoint")
    ap.add_argument("--eos-id", type=int, help="default: from the checkpoint")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    ap.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16, float64 (default: bf16 on CUDA, fp32 on CPU)"
    )
    ap.add_argument(
        "--threads", type=int, metavar="N", help="CPU threads of the model (default: torch's, all the cores)"
    )
    add_edit_ids_argument(ap)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    preset = PRESETS[args.mode]
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be at least 1, not {args.threads}")
        import torch

        torch.set_num_threads(args.threads)

    try:
        checks.whole("gen_length", args.gen_length, 1)
        checks.whole("max_post_steps (the post-edit budget)", args.max_post_steps, 0)
        if args.block_length is not None:
            checks.whole("block length", args.block_length, 1)
        checks.thresholds(
            preset.threshold if args.threshold is None else args.threshold,
            preset.editing_threshold if args.editing_threshold is None else args.editing_threshold,
        )
    except ValueError as err:  # known before the model loads: said at once
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype, edit_ids=args.edit_ids)
        tokenizer = load_tokenizer(args.model)
    except (CheckpointError, ValueError) as err:
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    if args.prompt is not None:
        if tokenizer is None:
            print("llada-lsp generate: this checkpoint has no tokenizer; use --prompt-ids", file=sys.stderr)
            return 2
        prompt_ids = tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = args.prompt_ids
    policy = JointThreshold(
        preset.threshold if args.threshold is None else args.threshold,
        preset.editing_threshold if args.editing_threshold is None else args.editing_threshold,
    )
    try:  # the engine checks every value (engine/checks.py): a bad one is one line, exit 2, as from Python
        result = (
            Engine(model, block_size=args.block_length)
            .generation(
                prompt_ids, args.gen_length, policy, args.max_post_steps, args.eos_early_stop, args.mask_id, args.eos_id
            )
            .run()
        )
    except ValueError as err:
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    text = tokenizer.decode(result.tokens, skip_special_tokens=True) if tokenizer is not None else None
    report = {
        "text": text, "tokens": result.tokens, "steps": result.steps,
        "prefill_forwards": result.prefill_forwards, "refreshed_blocks": result.refreshed_blocks,
        "tokens_per_forward": round(result.tokens_per_forward, 3), "tokens_per_second": round(result.tokens_per_second, 1),
        "seconds": round(result.seconds, 4),
    }  # fmt: skip
    if args.json:
        print(json.dumps(report))
    else:
        print(text if text is not None else " ".join(map(str, result.tokens)))
        print(
            f"-- {len(result.tokens)} tokens, {result.steps} steps (+{result.prefill_forwards} prefill), "
            f"{result.tokens_per_forward:.2f} tokens/forward, {result.tokens_per_second:.1f} tokens/s",
            file=sys.stderr,
        )
    return 0
