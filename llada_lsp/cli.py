"""The `llada-lsp` command: serves LSP by default; subcommands for the engine service, headless use,
decoding and diagnostics. The research tools (training, evaluation) are `llada-lab`'s (llada_lab/).

Only dispatches, with plain imports done when a subcommand runs (so `--help` and `--version` load no
torch): each subcommand's `<name>_main(argv)` owns its arguments and `--help`. `dispatch` is shared
with `llada-lab`'s table.
"""

from __future__ import annotations

import difflib
import os
import sys
from importlib import import_module

# name -> (module in the commands package, its `<name>_main`, what it does); imported only when it runs.
Subcommands = dict[str, tuple[str, str, str]]

SUBCOMMANDS: Subcommands = {
    "serve": ("serve", "serve_main", "the language server (the default)"),
    "engine": ("engine", "engine_main", "the engine service: one model for every editor's llada-lsp"),
    "complete": ("complete", "complete_main", "complete FILE:LINE:COL through the server, as an editor would"),
    "rewrite": ("complete", "rewrite_main", "rewrite FILE:L1:C1-L2:C2 through the server"),
    "plan": ("plan", "plan_main", "memory per device for a checkpoint, and whether it fits (no weights read)"),
    "generate": ("generate", "generate_main", "decode a prompt with a checkpoint and print the completion"),
    "bench": ("bench", "bench_main", "cached engine vs recompute-everything baseline on CPU"),
}


def run(prog: str, commands_package: str, subcommands: Subcommands, name: str, argv: list[str]) -> int:
    """Ctrl-C before a command handles it (while its modules import, say) ends it with the shell's
    usual code and one line, not a traceback."""
    module, function, _ = subcommands[name]
    try:
        return getattr(import_module(f"{commands_package}.{module}"), function)(argv) or 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def listing(subcommands: Subcommands) -> list[str]:
    return [f"  {name:<16} {doc}" for name, (_, _, doc) in subcommands.items()]


def dispatch(prog: str, commands_package: str, subcommands: Subcommands, usage: str, argv: list[str],
             default: str | None = None) -> int:  # fmt: skip
    """`-h`/`--help` prints `usage`, `-V`/`--version` the version; no subcommand, or options only, run
    `default` (without one: the usage, exit 2); an unknown name is one line with the closest match.
    A reader that closed stdout early (`plan | head`) ends any of them quietly, as SIGPIPE ends a C
    program: status 141, nothing on stderr."""
    try:
        try:
            code = _dispatch(prog, commands_package, subcommands, usage, argv, default)
        except SystemExit:  # argparse's --help and usage errors
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # inside the try: the last lines may reach the closed pipe only here
        return code
    except BrokenPipeError:
        # What is still buffered would fail again at the interpreter's exit flush: stdout goes nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE: the shell's status for a writer whose reader went away


def _dispatch(prog: str, commands_package: str, subcommands: Subcommands, usage: str, argv: list[str],
              default: str | None) -> int:  # fmt: skip
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"{prog} {__version__}")
        return 0
    if default is not None and (not argv or argv[0].startswith("-")):
        return run(prog, commands_package, subcommands, default, argv)
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] not in subcommands:
        close = difflib.get_close_matches(argv[0], list(subcommands), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"{prog}: unknown subcommand {argv[0]!r}{hint} (see {prog} --help)", file=sys.stderr)
        return 2
    return run(prog, commands_package, subcommands, argv[0], argv[1:])


def usage() -> str:
    lines = ["usage: llada-lsp [serve options] | llada-lsp SUBCOMMAND [options] | llada-lsp --version", "",
             "With no subcommand, serves the Language Server Protocol on stdio (see `llada-lsp serve --help`).", "",
             "subcommands:", *listing(SUBCOMMANDS), "",
             "Training and evaluation are the research tools' own command: see `llada-lab --help`."]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return dispatch("llada-lsp", "llada_lsp.commands", SUBCOMMANDS, usage(), argv, default="serve")


if __name__ == "__main__":
    raise SystemExit(main())
