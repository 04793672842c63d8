"""`llada-lsp generate`: decode one prompt with a checkpoint and print the completion and its speed.

How a user checks a checkpoint. Text prompts need the checkpoint's tokenizer; `--prompt-ids` does not.
"""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from ..completion.generation import add_model_arguments
from ..engine import PRESETS, Engine, JointThreshold, checks
from ..model import CheckpointError, load_model, load_serving_tokenizer


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants comma-separated integers, got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llada-lsp generate", description=__doc__.split("\n\n")[0])
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
    # --model, --device, --dtype, --edit-ids and --threads as the server has them: torch's default of
    # every core ran 28x slower than one thread on a busy machine (4.4 against 125.4 tokens/s).
    add_model_arguments(ap)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def generate_main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    preset = PRESETS[args.mode]
    threshold = preset.threshold if args.threshold is None else args.threshold
    editing = preset.editing_threshold if args.editing_threshold is None else args.editing_threshold
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, not {args.threads}")
    try:
        checks.whole("gen_length", args.gen_length, 1)
        checks.whole("max_post_steps (the post-edit budget)", args.max_post_steps, 0)
        if args.block_length is not None:
            checks.whole("block length", args.block_length, 1)
        checks.thresholds(threshold, editing)
    except ValueError as err:  # known before the model loads: said at once
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    # Progress on stderr, at a terminal only (tqdm's disable=None): the load, then the tokens decoded.
    bar = tqdm(desc=f"loading {args.model or 'the embedded model'}", total=None, unit=" tokens", leave=False,
               disable=None, file=sys.stderr, bar_format="{desc} {elapsed}")  # fmt: skip
    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype, edit_ids=args.edit_ids)
        tokenizer = load_serving_tokenizer(args.model)
    except (CheckpointError, ValueError) as err:
        bar.close()
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    if args.prompt is not None:
        if tokenizer is None:
            bar.close()
            print("llada-lsp generate: this checkpoint has no tokenizer; use --prompt-ids", file=sys.stderr)
            return 2
        prompt_ids = tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = args.prompt_ids
    policy = JointThreshold(threshold, editing)
    bar.set_description("decoding")
    bar.bar_format = None  # tqdm's own: count, bar, rate
    bar.reset(total=args.gen_length)
    try:  # the engine checks every value (engine/checks.py): a bad one is one line, exit 2, as from Python
        generation = Engine(model, block_size=args.block_length).generation(
            prompt_ids, args.gen_length, policy, args.max_post_steps, args.eos_early_stop, args.mask_id, args.eos_id
        )
        mask_id = generation.settings.mask_id  # the engine's: the flag's, else the checkpoint's
        for draft in generation:
            bar.update(sum(t != mask_id for t in draft.generated) - bar.n)
        result = generation.result
    except ValueError as err:
        print(f"llada-lsp generate: {err}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    threads = torch.get_num_threads()
    text = tokenizer.decode(result.tokens, skip_special_tokens=True) if tokenizer is not None else None
    report = {
        "text": text, "tokens": result.tokens, "steps": result.steps,
        "prefill_forwards": result.prefill_forwards, "refreshed_blocks": result.refreshed_blocks,
        "tokens_per_forward": round(result.tokens_per_forward, 3), "tokens_per_second": round(result.tokens_per_second, 1),
        "seconds": round(result.seconds, 4), "threads": threads,
    }  # fmt: skip
    if args.json:
        print(json.dumps(report))
    else:
        print(text if text is not None else " ".join(map(str, result.tokens)))
        print(
            f"-- {len(result.tokens)} tokens, {result.steps} steps (+{result.prefill_forwards} prefill), "
            f"{result.tokens_per_forward:.2f} tokens/forward, {result.tokens_per_second:.1f} tokens/s, "
            f"{threads} thread{'s' if threads != 1 else ''}",
            file=sys.stderr,
        )
    return 0
