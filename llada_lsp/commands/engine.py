"""`llada-lsp engine`: the engine service's process (listen, load, serve until SIGTERM or Ctrl-C) and
`llada-lsp engine status`, which asks a running one what it serves.

Command line and process only: the sessions are service/sessions.py, the socket service/listener.py,
the model's thread runtime/worker.py, the backends backends/.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import logging
import math
import os
import signal
import sys

from .. import wire
from ..address import Address, default_socket_path, parse_address, read_token
from ..backends.sglang_config import MODES as SGLANG_MODES
from ..backends.sglang_config import backend_argument
from ..completion.generation import ModelSpec, add_model_arguments
from ..runtime.loop import run
from ..service.client import EngineClient, EngineFailure
from ..service.listener import AlreadyServing, Listener, holder
from ..service.sessions import EngineService

logger = logging.getLogger("llada_lsp.service")


def give_big_buffers_back() -> None:
    """glibc raises its mmap threshold each time a large buffer is freed, so that later ones come from
    the heap, which it rarely gives back: a client's 15 MB frame would leave the service that much
    bigger for good. Fixed at 1 MiB, every larger buffer (a frame, a window) is returned when freed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 2**20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: its allocator is its own business
        pass


async def serve(args: argparse.Namespace, address: Address, token: str | None) -> int:
    """Runs the service until SIGTERM or SIGINT; 1 if it cannot listen."""
    give_big_buffers_back()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        listener = Listener.claim(address)
    except (AlreadyServing, ValueError, OSError) as err:
        print(f"llada-lsp engine: {err}", file=sys.stderr)
        return 1

    def log(line: str) -> None:
        logger.info("%s", line)

    if args.backend is None:
        from ..backends import native
        from ..engine.policy import PRESETS  # torch: paid by the service, not by `engine status` or --help

        worker, modes = native.start(loop, log), list(PRESETS)
    else:  # the tokenizer is ours, the model runs on SGLang servers (backends/sglang.py)
        from ..backends.sglang import SGLangWorker  # httpx: paid by an SGLang service only

        worker, modes = SGLangWorker(loop, log, args.backend), list(SGLANG_MODES)
    service = EngineService(worker, modes, token)
    try:
        await listener.bind(service.handle)
    except OSError as err:  # a TCP port in use
        print(f"llada-lsp engine: cannot listen on {address}: {err}", file=sys.stderr)
        return 1
    else:
        service.load(ModelSpec(args.model, args.device, args.dtype, max(1, args.threads), args.max_batch,
                               args.cache_mb, args.prefix_cache, args.max_queue, args.quantize, args.devices,
                               args.cuda_graph, args.prefill_chunk, args.edit_ids))  # fmt: skip
        logger.info("listening on %s", listener.address)

        def lost(why: str) -> None:
            logger.error("%s", why)
            stop.set()

        watch = asyncio.create_task(listener.watch(lost))
        await stop.wait()
        watch.cancel()
        logger.info("stopping")
    finally:
        listener.close()  # first: no new connection while the others close
        await service.close()
        if not worker.stop(timeout=1):  # a step ends within one denoising step of the cancel; past 1 s,
            # the thread ends with the process, which does not wait for it
            logger.warning("the model thread did not stop within 1 s (a step is stuck, or a load is still reading "
                           "a tensor): the process ends without it")  # fmt: skip
        await worker.aclose()  # after the aborts of the requests it was serving (SGLang)
    return 0


async def ask_status(address: Address, token: str | None) -> wire.Status:
    async with await EngineClient.connect(address, "llada-lsp engine status", token, timeout=5, totals=True) as client:
        return await asyncio.wait_for(client.status(), 5)


def status_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="llada-lsp engine status",
        description="Ask a running engine service what it serves: model, state, connected clients and "
        "requests in flight; `state: starting` for one that has the socket's path but does not listen yet. "
        "Exits 1 if nothing answers there.",
    )
    _address_arguments(ap)
    args = ap.parse_args(argv)
    address, token = _address_of(ap, args, need_token=False)
    try:
        status = asyncio.run(ask_status(address, token))
    except (EngineFailure, TimeoutError) as err:
        pid = holder(address)
        if pid is not None and getattr(err, "kind", None) == "unreachable":
            # It has the path and is importing its libraries (seconds): not an engine that is missing.
            print(f"address: {address}\nstate: starting (pid {pid}: not listening yet)")
            return 0
        print(f"llada-lsp engine: {getattr(err, 'message', None) or f'no answer from {address}'}", file=sys.stderr)
        return 1
    lines = {"address": str(address), "model": status.model, "family": status.family_line,
             "state": status.state, "error": status.error, "kernels": status.kernels,
             "loading": f"{status.message} ({status.progress}%)" if status.progress is not None else None,
             "clients": max(0, (status.clients or 0) - 1), "queue": status.queue,
             "decoding": f"{status.running} running, {status.queued} waiting" if status.running is not None else None,
             "batches": f"{status.steps} forwards, {status.batch_mean:.2f} rows each on average, at most "
                        f"{status.batch_max}" if status.steps else None,
             "kv blocks": f"{status.cache_blocks_used} used, {status.cache_blocks_free} free"
                          if status.cache_blocks_used is not None else None,
             "prefix cache hits": f"{status.cache_hit_rate:.0%} of whole prompt blocks"
                                  if status.cache_hit_rate is not None else None}  # fmt: skip
    for name, value in lines.items():  # clients: this command's own connection is not counted
        if value is not None:
            print(f"{name}: {value}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llada-lsp engine",
        description="The llada-lsp engine service: loads the model once and serves completions and "
        "rewrites to many language-server fronts (one per editor) over a socket, in the protocol of "
        "llada_lsp/wire.py. Stops on SIGTERM or Ctrl-C, removing its socket. "
        "`llada-lsp engine status [--listen ADDRESS]` asks a running one what it serves.",
    )
    add_model_arguments(ap)
    big = ap.add_argument_group("large models (see `llada-lsp plan`)")
    big.add_argument("--quantize", choices=["fp8"],
                     help="fp8: the routed experts in FP8 with 128x128 block scales, quantized at load from a "
                     "bf16 checkpoint (one already in FP8 loads as is)")  # fmt: skip
    big.add_argument("--devices", type=_devices, metavar="DEV,DEV,...",
                     help="split the layers over several devices, e.g. cuda:0,cuda:1 (instead of --device): "
                     "contiguous layer ranges balanced by bytes, each layer's K/V beside it")  # fmt: skip
    batching = ap.add_argument_group("batching and the K/V cache")
    batching.add_argument("--max-batch", type=_positive, default=8, metavar="N",
                          help="requests decoded together in one forward (default: 8; 1 decodes one at a "
                          "time, in arrival order)")  # fmt: skip
    batching.add_argument("--max-queue", type=_positive, default=64, metavar="N",
                          help="requests that may wait for a place in the batch; more are answered `busy` "
                          "(default: 64)")  # fmt: skip
    batching.add_argument("--cache-mb", type=lambda text: _amount(text, 0.0), metavar="MB",
                          help="memory for keys and values, in 32-token blocks, shared by the running requests "
                          "and the prefix cache (default: 256 on the CPU, a quarter of the free memory on a "
                          "GPU; never less than one request of the model's full length)")  # fmt: skip
    batching.add_argument("--prefill-chunk", type=_positive, metavar="TOKENS",
                          help="most prompt tokens per prefill forward, in whole blocks, interleaved with the "
                          "other requests' steps (default: 2048)")  # fmt: skip
    batching.add_argument("--cuda-graph", action="store_true",
                          help="replay each denoising step from a CUDA graph per batch size (CUDA, the whole model "
                          "on one device; off by default until measured: docs/gpu.md)")  # fmt: skip
    batching.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="never reuse the keys and values of prompt blocks an earlier request computed",
    )
    remote = ap.add_argument_group("where the model runs")
    remote.add_argument("--backend", type=backend_argument, metavar="native|sglang+URL[,quality=URL]",
                        help="native (default): this process loads the model; sglang+http://HOST:PORT"
                        "[,quality=http://HOST2:PORT2]: SGLang servers generate (speed requests to the first, "
                        "quality to the second, else to the first), the prompts are tokenized here with --model's "
                        "tokenizer (docs/sglang.md)")  # fmt: skip
    remote.add_argument(
        "--backend-token-file",
        metavar="PATH",
        help="a file of yours with mode 0600 holding the --api-key of the SGLang servers",
    )
    remote.add_argument("--backend-timeout", type=_amount, default=30.0, metavar="SECONDS",
                        help="how long an SGLang server may send nothing in the middle of an answer before the "
                        "request fails (default: 30)")  # fmt: skip
    _address_arguments(ap)
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                    help="what the service logs on stderr: info is a line per connection and per request "
                    "(default: info)")  # fmt: skip
    return ap


def _devices(text: str) -> tuple[str, ...]:
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    if len(devices) < 2:
        raise argparse.ArgumentTypeError("name at least two devices, e.g. cuda:0,cuda:1 (one: use --device)")
    return devices


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _amount(text: str, least: float | None = None) -> float:
    """A finite number above 0 (seconds), or at least `least` (megabytes: 0 is the least pool): NaN,
    inf and values below are refused by argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not math.isfinite(value) or (value < least if least is not None else value <= 0):
        bound = "above 0" if least is None else f"{least:g} or more"
        raise argparse.ArgumentTypeError(f"must be a finite number, {bound}, not {text}")
    return value


def _address_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--listen", metavar="ADDRESS",
                    help="unix:PATH, or tcp://HOST:PORT (tcp://:PORT is loopback; needs --token-file); default: "
                    f"unix:{default_socket_path()} ($XDG_RUNTIME_DIR/llada-lsp/engine.sock where "
                    "XDG_RUNTIME_DIR is set, else llada-lsp-<uid>/engine.sock in the temporary folder)")  # fmt: skip
    ap.add_argument("--token-file", metavar="PATH",
                    help="a file of yours with mode 0600 holding the secret every client must present "
                    "(required with tcp://; the token travels unencrypted: keep TCP on loopback or a "
                    "trusted network)")  # fmt: skip


def _address_of(ap: argparse.ArgumentParser, args: argparse.Namespace, need_token: bool) -> tuple[Address, str | None]:
    try:
        address = parse_address(args.listen)
        token = read_token(args.token_file) if args.token_file else None
    except (ValueError, OSError) as err:
        ap.error(str(err))
    if need_token and address.kind == "tcp" and token is None:
        ap.error("listening on TCP needs --token-file: anyone who can reach the port could use the engine")
    return address, token


def engine_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    ap = parser()
    args = ap.parse_args(argv)
    address, token = _address_of(ap, args, need_token=True)
    if args.devices and args.device:
        ap.error("--device and --devices: give one")
    if args.backend is None and args.backend_token_file:
        ap.error("--backend-token-file is for --backend sglang+URL")
    if args.backend is not None:
        try:
            args.backend = args.backend.configured(args.backend_token_file, args.backend_timeout)
        except (ValueError, OSError) as err:
            ap.error(str(err))
    log_format = "llada-lsp engine %(levelname)s: %(message)s"
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format=log_format)
    code = run(serve(args, address, token))
    # The socket and its lock are gone, every connection closed, the log written: the process ends here.
    # The interpreter's own teardown (torch and numba loaded, the model thread perhaps still in a step)
    # took 2 s more on SIGTERM, and a client restarting the engine waited for it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(engine_main())
