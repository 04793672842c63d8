"""The `llada-lsp` command: serves LSP by default; subcommands for the engine service, headless use,
decoding, benchmarks, training and evaluation.

Only dispatches, with plain imports done when a subcommand runs (so `--help` and `--version` load no
torch): each subcommand's `<name>_main(argv)` owns its arguments and `--help`.
"""

from __future__ import annotations

import difflib
import sys
from typing import Callable


def serve(argv: list[str]) -> int:
    from .server.main import serve_main

    return serve_main(argv)


def engine(argv: list[str]) -> int:
    from .service.engine import engine_main

    return engine_main(argv)


def complete(argv: list[str]) -> int:
    from .server.headless import complete_main

    return complete_main(argv)


def rewrite(argv: list[str]) -> int:
    from .server.headless import rewrite_main

    return rewrite_main(argv)


def generate(argv: list[str]) -> int:
    from .commands.generate import generate_main

    return generate_main(argv)


def bench(argv: list[str]) -> int:
    from .commands.bench import bench_main

    return bench_main(argv)


def plan(argv: list[str]) -> int:
    from .commands.plan import plan_main

    return plan_main(argv)


def train(argv: list[str]) -> int:
    from .training.train import train_main

    return train_main(argv)


def eval_infill(argv: list[str]) -> int:
    from .training.eval_infill import eval_infill_main

    return eval_infill_main(argv)


def eval_rewrite(argv: list[str]) -> int:
    from .training.eval_rewrite import eval_rewrite_main

    return eval_rewrite_main(argv)


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (serve, "the language server (the default)"),
    "engine": (engine, "the engine service: one model for every editor's llada-lsp"),
    "complete": (complete, "complete FILE:LINE:COL through the server, as an editor would"),
    "rewrite": (rewrite, "rewrite FILE:L1:C1-L2:C2 through the server"),
    "generate": (generate, "decode a prompt with a checkpoint and print the completion"),
    "bench": (bench, "cached engine vs recompute-everything baseline on CPU"),
    "plan": (plan, "memory per device for a checkpoint, and whether it fits (no weights read)"),
    "train": (train, "train the embedded model (CPU, resumable)"),
    "eval-infill": (eval_infill, "score infill on held-out standard-library files"),
    "eval-rewrite": (eval_rewrite, "rewrite held-out selections: parsed, applied, refused"),
}


def usage() -> str:
    lines = ["usage: llada-lsp [serve options] | llada-lsp SUBCOMMAND [options] | llada-lsp --version", "",
             "With no subcommand, serves the Language Server Protocol on stdio (see `llada-lsp serve --help`).", "",
             "subcommands:"]  # fmt: skip
    lines += [f"  {name:<12} {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
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
        return serve(argv) or 0
    if argv[0] not in SUBCOMMANDS:
        close = difflib.get_close_matches(argv[0], list(SUBCOMMANDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"llada-lsp: unknown subcommand {argv[0]!r}{hint} (see llada-lsp --help)", file=sys.stderr)
        return 2
    run, _ = SUBCOMMANDS[argv[0]]
    return run(argv[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main())
