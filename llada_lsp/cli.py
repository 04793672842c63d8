"""The `llada-lsp` command: serves LSP by default; subcommands for the engine service, headless use,
decoding, benchmarks, training and evaluation.

Only dispatches, with plain imports done when a subcommand runs (so `--help` and `--version` load no
torch): each subcommand's `<name>_main(argv)` owns its arguments and `--help`.
"""

from __future__ import annotations

import difflib
import sys
from importlib import import_module

# name -> (module, its `<name>_main`, what it does); each module is imported only when its command runs.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("serve", "serve_main", "the language server (the default)"),
    "engine": ("engine", "engine_main", "the engine service: one model for every editor's llada-lsp"),
    "complete": ("complete", "complete_main", "complete FILE:LINE:COL through the server, as an editor would"),
    "rewrite": ("complete", "rewrite_main", "rewrite FILE:L1:C1-L2:C2 through the server"),
    "generate": ("generate", "generate_main", "decode a prompt with a checkpoint and print the completion"),
    "bench": ("bench", "bench_main", "cached engine vs recompute-everything baseline on CPU"),
    "plan": ("plan", "plan_main", "memory per device for a checkpoint, and whether it fits (no weights read)"),
    "train": ("train", "train_main", "train the embedded model (CPU, resumable)"),
    "eval-infill": ("eval_infill", "eval_infill_main", "score infill on held-out standard-library files"),
    "eval-rewrite": ("eval_rewrite", "eval_rewrite_main", "rewrite held-out selections: parsed, applied, refused"),
    "eval-next-edit": (
        "eval_next_edit",
        "eval_next_edit_main",
        "next-edit suggestions on held-out commits, per configuration",
    ),
    "edit-pairs": ("edit_pairs", "edit_pairs_main", "rebuild the next-edit cases from their manifest (git history)"),
    "tune-next-edit": (
        "tune_next_edit",
        "tune_next_edit_main",
        "fine-tune the embedded model on next edits (CPU, resumable)",
    ),
    "eval-typing": ("eval_typing", "eval_typing_main", "replay typing held-out files: what revisions save"),
}


def run(name: str, argv: list[str]) -> int:
    """Ctrl-C before a command handles it (while its modules import, say) ends it with the shell's
    usual code and one line, not a traceback."""
    module, function, _ = SUBCOMMANDS[name]
    try:
        return getattr(import_module(f".commands.{module}", __package__), function)(argv) or 0
    except KeyboardInterrupt:
        print("llada-lsp: interrupted", file=sys.stderr)
        return 130


def usage() -> str:
    lines = ["usage: llada-lsp [serve options] | llada-lsp SUBCOMMAND [options] | llada-lsp --version", "",
             "With no subcommand, serves the Language Server Protocol on stdio (see `llada-lsp serve --help`).", "",
             "subcommands:"]  # fmt: skip
    lines += [f"  {name:<15} {doc}" for name, (_, _, doc) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"llada-lsp {__version__}")
        return 0
    if not argv or argv[0].startswith("-"):  # serve options only: the default subcommand
        return run("serve", argv)
    if argv[0] not in SUBCOMMANDS:
        close = difflib.get_close_matches(argv[0], list(SUBCOMMANDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"llada-lsp: unknown subcommand {argv[0]!r}{hint} (see llada-lsp --help)", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
