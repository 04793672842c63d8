"""`llada-lsp` / `llada-lsp serve`: the language server's command line, over stdio (what editors
start) or TCP, and the process's exit code.

Command line and process only: the server is server/language_server.py and server/handlers.py. This
is also where the server's model in this process is chosen: the native backend's loader.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..address import parse_address, read_token
from ..backends import native
from ..completion.generation import add_model_arguments
from ..server import tcp
from ..server.completers import LocalCompleter
from ..server.handlers import create_server
from ..server.language_server import Launch, LladaServer
from ..server.protocol import exit_now
from ..server.settings import MODES, Settings


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llada-lsp",
        description="The llada-lsp language server: inline code completions from a LLaDA2.1 block-diffusion "
        "model, over stdio (what editors start) or TCP. Clients can override the model and modes with "
        "initializationOptions and workspace/didChangeConfiguration (see docs/protocol.md).",
    )
    # LSP client frameworks start a server with the transport they chose: vscode-languageclient appends
    # `--stdio`, some clients add `--clientProcessId`. stdio is already the default, so both are accepted.
    ap.add_argument("--stdio", action="store_true", help="serve LSP over stdio (the default; accepted because LSP "
                    "client frameworks pass it)")  # fmt: skip
    ap.add_argument("--clientProcessId", metavar="PID", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tcp", metavar="HOST:PORT", help="serve LSP over TCP instead of stdio, one client at a "
                    "time, each sending the token of --token-file first (docs/protocol.md)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH", help="the token for TCP (a file only you can read, mode 0600): "
                    "what clients of --tcp send first, and what is sent to an engine service on tcp://")  # fmt: skip
    add_model_arguments(ap)
    ap.add_argument("--inline-mode", choices=MODES, default="speed",
                    help="decoding preset of inline completions (default: speed)")  # fmt: skip
    ap.add_argument("--rewrite-mode", choices=MODES, default="quality",
                    help="decoding preset of rewrites (default: quality)")  # fmt: skip
    ap.add_argument("--engine", default="auto", metavar="auto|local|unix:PATH|tcp://HOST:PORT",
                    help="where the model runs: an engine service (`llada-lsp engine`) at an address, `local` (in this "
                    "process), or `auto` (default): the service at the default socket if one answers, else local. "
                    "With a service, --model/--device/--dtype/--threads are the service's own")  # fmt: skip
    ap.add_argument("--no-revise", dest="revise", action="store_false",
                    help="start every inline completion from masks, even while the user types through the last "
                    "suggestion (the default revises it: the `revise` setting)")  # fmt: skip
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="what the server logs on stderr (default: warning)")  # fmt: skip
    return ap


def serve_main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log_format = "llada-lsp %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format=log_format)
    defaults = Settings(model=args.model, inline_mode=args.inline_mode, rewrite_mode=args.rewrite_mode,
                        revise=args.revise)  # fmt: skip
    token = None
    try:
        if args.engine not in ("auto", "local"):
            parse_address(args.engine)
        if args.token_file:
            token = read_token(args.token_file)
    except (ValueError, OSError) as err:
        parser().error(str(err))
    launch = Launch(defaults, args.device, args.dtype, max(1, args.threads), args.engine, token, native.load,
                    args.edit_ids)  # fmt: skip
    if args.tcp and args.stdio:
        parser().error("--stdio and --tcp: choose one transport")
    if args.tcp:
        try:
            host, port = tcp.parse_listen(args.tcp)
        except ValueError as err:
            parser().error(str(err))
        if token is None:
            parser().error("--tcp needs --token-file: anyone who can reach the port could use the server")
        return tcp.serve(host, port, launch, token)
    ls = create_server(launch)
    if sys.stdin.isatty():  # started by hand: say why nothing happens
        print("llada-lsp: waiting for an LSP client on stdin; see --help", file=sys.stderr)
    ls.start_io()
    return _end(ls)


def _end(ls: LladaServer) -> int:
    """The exit code once the client has gone without `exit` (the end of stdin). The model thread is
    told to stop, not waited for (a load stops only at its next tensor, a step may be stuck); while it
    still runs the process ends at once: an interpreter tearing down under a thread inside torch wrote
    `I/O operation on closed file` tracebacks by the thousand."""
    code = 0 if ls.shutdown_requested else 1
    if isinstance(ls.completer, LocalCompleter) and not ls.completer.worker.stop(timeout=0):
        exit_now(code)
    return code
