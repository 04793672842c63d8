"""The `llada-lsp` command: serves LSP by default; subcommands for the engine, training and headless use.

Only dispatches: each subcommand's module owns its own arguments and `--help`.
"""

from __future__ import annotations

import difflib
import importlib
import sys

SUBCOMMANDS = {
    "engine": ("llada_lsp.service.engine", "main", "the engine service: one model for every editor's llada-lsp"),
    "generate": ("llada_lsp.commands.generate", "generate_main", "decode a prompt with a checkpoint and print the completion"),
    "bench": ("llada_lsp.commands.bench", "main", "cached engine vs recompute-everything baseline on CPU"),
    "complete": ("llada_lsp.server.headless", "complete_main", "complete FILE:LINE:COL through the server, as an editor would"),
    "rewrite": ("llada_lsp.server.headless", "rewrite_main", "rewrite FILE:L1:C1-L2:C2 through the server"),
    "train": ("llada_lsp.training.train", "main", "train the embedded model (CPU, resumable)"),
    "eval-infill": ("llada_lsp.training.eval_infill", "main", "score infill on held-out standard-library files"),
    "eval-rewrite": ("llada_lsp.training.eval_rewrite", "main", "rewrite held-out selections: parsed, applied, refused"),
}


def usage() -> str:
    lines = ["usage: llada-lsp [serve options] | llada-lsp SUBCOMMAND [options] | llada-lsp --version", "",
             "With no subcommand, serves the Language Server Protocol on stdio (see `llada-lsp serve --help`).", "",
             "subcommands:", "  serve        the language server (the default)"]
    lines += [f"  {name:<12} {doc}" for name, (_, _, doc) in SUBCOMMANDS.items()]
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
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS and argv[0] != "serve":
        close = difflib.get_close_matches(argv[0], [*SUBCOMMANDS, "serve"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"llada-lsp: unknown subcommand {argv[0]!r}{hint} (see llada-lsp --help)", file=sys.stderr)
        return 2
    if argv and argv[0] in SUBCOMMANDS:
        module, func, _ = SUBCOMMANDS[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:]) or 0
    if argv and argv[0] == "serve":
        argv = argv[1:]
    from .server.main import serve_main

    return serve_main(argv) or 0


if __name__ == "__main__":
    raise SystemExit(main())
