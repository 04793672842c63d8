"""`llada-lab eval-infill --cross-file`: does context from other files help? Infill through the real
server over stdio, as an editor drives it, with the `contextFiles` setting on against off.

Tasks (training/cross_file.py): rest-of-line and whole-line holes in held-out third-party files whose
answer uses a name only an imported module of the same package defines; and, to show the context
costs nothing where it cannot help, the single-file held-out infill tasks of the same split with other
files of the package open too. The editor's workspace is a temporary folder holding every package's
files (the current file with its hole), one workspace folder per package; per task it opens the
imported modules, then the current file, asks one inline completion at the cursor and closes them.
Both servers run side by side, each task asked of one and then the other (alternating who goes
first). Scores: first-line exact match, the task-by-task sign test, p50/p95 of the answer's latency
(from the request to its answer, client side). With `--engine-service`, each server's model runs in
its own engine service (`llada-lsp engine`), and the services' prefix-cache hit rates are read at the
end (the in-process engine reports none to the LSP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from llada_lsp.lsp_client import LspClient, position
from llada_lsp.report import Report, Table, add_markdown_argument
from llada_lsp.server.positions import UTF32

from ..training.corpus import DEFAULT_CACHE, SPLIT_FILES, SourceFile, load
from ..training.cross_file import (
    CROSS_FILE_KINDS,
    MAX_OPEN,
    CrossFileTask,
    group_by_package,
    imported_modules,
    make_cross_file_tasks,
    modules_of,
    package_of,
    relative_path,
)
from ..training.eval_infill import cut_to_unit, first_line, make_tasks, sign_test

_CHOSEN = re.compile(r"^llada: context for (\S+) at line \d+(?: \(idle\))?: (.*)$")  # server/language_server.py's line
CONFIGS = {"on": {"contextFiles": True}, "off": {"contextFiles": False}}
BLOCK = 32  # the embedded engine's block: an infill that is not on an empty line generates at most one
INVOKED = 1  # InlineCompletionTriggerKind.Invoked: the user asked (no debounce in the way)


@dataclass
class Answers:
    """One configuration's answers to one task set, in task order; `name_shown`: whether the lines of
    the snippets the server chose hold the task's name (before the prompt cut them to its share)."""

    texts: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)  # snippets chosen per task
    name_shown: list[bool] = field(default_factory=list)


@dataclass
class Server:
    """A server and the snippet set it last said it chose per document (its log line)."""

    client: LspClient
    chosen: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)  # uri -> [(label, first, end)]

    def on_log(self, params: dict) -> None:
        if match := _CHOSEN.match(params.get("message", "")):
            places = [p.rsplit(":", 1) for p in match[2].split(", ")] if match[2] != "none" else []
            spans = [(label, *lines.split("-")) for label, lines in places]  # the lines FIRST-LAST, from 1
            self.chosen[match[1]] = [(label, int(first) - 1, int(last)) for label, first, last in spans]


class Workspace:
    """The editor's workspace on disk: every package's files under ROOT/NAME (its sdist's layout)."""

    def __init__(self, root: Path, packages: dict[str, list[SourceFile]]):
        self.root, self.packages = root, packages
        for files in packages.values():
            for f in files:
                self.write(f.path, f.text)

    def path_of(self, corpus_path: str) -> Path:
        return self.root / package_of(corpus_path) / relative_path(corpus_path)

    def uri(self, corpus_path: str) -> str:
        return self.path_of(corpus_path).as_uri()

    def write(self, corpus_path: str, text: str) -> None:
        path = self.path_of(corpus_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def folders(self) -> list[dict[str, str]]:
        return [{"uri": (self.root / name).as_uri(), "name": name} for name in sorted(self.packages)]


async def start_server(command: list[str], options: dict, workspace: Workspace) -> Server:
    """The server as an editor starts it: the workspace folders in `initialize` (lsp_client's
    `initialize` sends none), `options` as its initializationOptions; ready once the model has loaded
    and answered once."""
    client = await LspClient.start(command, stderr="discard")
    server = Server(client)
    client.on("window/logMessage", server.on_log)
    ready = asyncio.Event()  # completions answer with nothing while the model loads: wait for its status
    client.on("llada/status", lambda status: ready.set() if status.get("state") == "ready" else None)
    capabilities = {"general": {"positionEncodings": [UTF32]}, "workspace": {"workspaceFolders": True}}
    params = {"processId": os.getpid(), "rootUri": workspace.root.as_uri(), "capabilities": capabilities,
              "workspaceFolders": workspace.folders(), "initializationOptions": options}  # fmt: skip
    result = await client.request("initialize", params, 120)
    client.capabilities = (result or {}).get("capabilities") or {}
    client.encoding = client.capabilities.get("positionEncoding") or client.encoding
    client.notify("initialized", {})
    await asyncio.wait_for(ready.wait(), 300)
    doc = client.did_open((workspace.root / "warm-up.py").as_uri(), "def f(x):\n    return \n")
    await complete(client, doc.uri, position(doc, len("def f(x):\n    return "), client.encoding), 300)
    client.did_close(doc)
    return server


async def complete(client: LspClient, uri: str, at: dict, timeout: float) -> tuple[str, float]:
    """One inline completion: (the first item's text or "", seconds from request to answer)."""
    request = client.send("textDocument/inlineCompletion",
                          {"textDocument": {"uri": uri}, "position": at, "context": {"triggerKind": INVOKED}})  # fmt: skip
    result = await client.result(request, timeout)
    items = result.get("items", []) if isinstance(result, dict) else result or []  # a list or an InlineCompletionList
    return (items[0]["insertText"] if items else ""), request.arrived - request.sent


async def ask(server: Server, workspace: Workspace, task: CrossFileTask, texts: dict[str, str],
              answers: Answers) -> None:  # fmt: skip
    """The editor's part of one task: the modules open, then the current file with its hole, one
    completion at the cursor, everything closed again; its answer and what the server chose, kept."""
    client = server.client
    opened = [client.did_open(workspace.uri(p), texts[p]) for p in task.opened]
    doc = client.did_open(workspace.uri(task.path), task.prefix + task.suffix)
    server.chosen.pop(doc.uri, None)
    text, seconds = await complete(client, doc.uri, position(doc, len(task.prefix), client.encoding), 120)
    for d in (doc, *opened):
        client.did_close(d)
    chosen = server.chosen.pop(doc.uri, [])
    package = f"pypi/{package_of(task.path)}/"
    lines = ["".join(texts.get(package + label, "").splitlines(keepends=True)[first:end])
             for label, first, end in chosen]  # fmt: skip
    answers.texts.append(cut_to_unit(task.kind, text))
    answers.seconds.append(seconds)
    answers.chosen.append(len(chosen))
    answers.name_shown.append(bool(task.name) and any(task.name in text for text in lines))


async def start_engine(address: str, command: list[str]) -> asyncio.subprocess.Process:
    """An engine service listening on `address`, once its socket answers a status request."""
    from llada_lsp.address import parse_address
    from llada_lsp.commands.engine import ask_status

    process = await asyncio.create_subprocess_exec(*command, "--listen", address, stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while True:
        try:
            await ask_status(parse_address(address), None)
            return process
        except Exception:  # not listening yet (no socket, refused): asked again until the deadline
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the engine service on {address} did not start") from None
            await asyncio.sleep(0.5)


async def hit_rate(address: str) -> float | None:
    """The service's prefix-cache hits: whole prompt blocks found / looked up, every client together."""
    from llada_lsp.address import parse_address
    from llada_lsp.commands.engine import ask_status

    return (await ask_status(parse_address(address), None)).cache_hit_rate


async def run_all(commands: dict[str, tuple[list[str], dict]], splits: dict[str, list[CrossFileTask]],
                  workspace: Workspace, texts: dict[str, str],
                  engines: dict[str, tuple[str, list[str]]] | None = None) -> tuple[dict, dict[str, float | None]]:  # fmt: skip
    """Every split's tasks asked of every configuration's server (alternating which goes first): the
    answers per split and configuration, and per configuration its engine service's hit rate (with
    `engines`: name -> (address, the service's command); else none)."""
    services = {name: await start_engine(address, command) for name, (address, command) in (engines or {}).items()}
    servers = {name: await start_server(command, options, workspace) for name, (command, options) in commands.items()}
    out = {split: {name: Answers() for name in commands} for split in splits}
    rates: dict[str, float | None] = {}
    started = time.perf_counter()
    try:
        for split, tasks in splits.items():
            for index, task in enumerate(tasks):
                workspace.write(task.path, task.prefix + task.suffix)  # the disk never holds the answer
                for name in list(commands) if index % 2 == 0 else list(commands)[::-1]:
                    await ask(servers[name], workspace, task, texts, out[split][name])
                workspace.write(task.path, texts[task.path])
                if (index + 1) % 50 == 0:
                    print(f"[{split}: {index + 1}/{len(tasks)}, {time.perf_counter() - started:.0f}s]",
                          file=sys.stderr, flush=True)  # fmt: skip
        for name, (address, _) in (engines or {}).items():
            rates[name] = await hit_rate(address)
    finally:
        for server in servers.values():
            await server.client.shutdown(30)
        for process in services.values():
            process.terminate()
            await process.wait()
    return out, rates


def right(tasks: list[CrossFileTask], answers: Answers) -> list[bool]:
    return [first_line(a) == first_line(t.middle) for t, a in zip(tasks, answers.texts)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def single_file_tasks(current: list[SourceFile], packages: dict[str, list[SourceFile]], n: int,
                      seed: int) -> list[CrossFileTask]:  # fmt: skip
    """The held-out infill tasks of eval-infill (same cutter) on these files, with the modules each
    file imports (or, for a file that imports none, other files of its package) open too."""
    out = []
    for t in make_tasks(n, seed, current, kinds=CROSS_FILE_KINDS):
        package = packages[package_of(t.path)]
        f = next(f for f in package if f.path == t.path)
        imported = [g.path for g in imported_modules(f, modules_of(package))]
        others = imported or [g.path for g in package if g.path != f.path]
        out.append(CrossFileTask(t.kind, t.path, t.prefix, t.middle, t.suffix, "", tuple(others[:MAX_OPEN])))
    return out


def report(splits: dict[str, list[CrossFileTask]], answers: dict[str, dict[str, Answers]]) -> tuple[Table, list[str]]:
    table = Table(["tasks", "kind", "n", "first-line EM on", "first-line EM off", "only on", "only off", "sign p",
                   "p50 on ms", "p50 off ms", "p95 on ms", "p95 off ms"])  # fmt: skip
    notes = []
    for split, tasks in splits.items():
        for kind in (*CROSS_FILE_KINDS, "all"):
            idx = [i for i, t in enumerate(tasks) if kind in ("all", t.kind)]
            if not idx:
                continue
            on, off = answers[split]["on"], answers[split]["off"]
            r_on, r_off = right(tasks, on), right(tasks, off)
            only_on = sum(r_on[i] and not r_off[i] for i in idx)
            only_off = sum(r_off[i] and not r_on[i] for i in idx)
            s_on, s_off = [on.seconds[i] for i in idx], [off.seconds[i] for i in idx]
            table.add(split, kind, len(idx), f"{sum(r_on[i] for i in idx) / len(idx):.1%}",
                      f"{sum(r_off[i] for i in idx) / len(idx):.1%}", only_on, only_off,
                      f"{sign_test(only_on, only_off):.3g}", f"{percentile(s_on, 0.5) * 1000:.0f}",
                      f"{percentile(s_off, 0.5) * 1000:.0f}", f"{percentile(s_on, 0.95) * 1000:.0f}",
                      f"{percentile(s_off, 0.95) * 1000:.0f}")  # fmt: skip
            if kind == "all" and split == "cross-file":  # a softer score than exact match: is the name used at all?
                used_on, used_off = ([t.name in first_line(a.texts[i]) for i, t in enumerate(tasks)] for a in (on, off))
                name_on = sum(used_on[i] and not used_off[i] for i in idx)
                name_off = sum(used_off[i] and not used_on[i] for i in idx)
                notes.append(f"{split}: the answer's first line uses the name with context on {sum(used_on)} times, "
                             f"off {sum(used_off)}; only on {name_on}, only off {name_off} "
                             f"(sign test p = {sign_test(name_on, name_off):.3g})")  # fmt: skip
            if kind == "all":
                with_snippets = sum(on.chosen[i] > 0 for i in idx)
                shown = sum(on.name_shown[i] for i in idx)
                notes.append(f"{split}, context on: snippets chosen for {with_snippets} of {len(idx)} tasks"
                             + (f"; the answer's name in their lines (before the prompt's share cut them) for {shown}"
                                if split == "cross-file" else ""))  # fmt: skip
                notes.append(f"{split}: context on right where off is wrong on {only_on} tasks, off right where on "
                             f"is wrong on {only_off} (two-sided sign test p = {sign_test(only_on, only_off):.3g})")  # fmt: skip
    return table, notes


def coverage(tasks: list[CrossFileTask], workspace: Workspace, texts: dict[str, str], model: str | None,
             share: int) -> Table:  # fmt: skip
    """`--coverage`: the server's chooser (server/context_files.py, in this process: no model runs) on each
    task as `ask` sets it up, and whether the answer's name is in the snippets' lines, and in what the
    prompt keeps of them (completion/prompt.py `context_ids`: the share of the budget the engine gives
    an infill of that kind, with `model`'s tokenizer and positions)."""
    from llada_lsp.backends.base import load_codec
    from llada_lsp.completion.history import History
    from llada_lsp.completion.jobs import CONTEXT_TOKENS, MAX_TOKENS
    from llada_lsp.completion.pipeline import cursor_context
    from llada_lsp.completion.prompt import context_ids
    from llada_lsp.model import EMBEDDED_MODEL
    from llada_lsp.server.context_files import ContextFiles
    from llada_lsp.server.documents import Document

    codec = load_codec(model, model or "embedded")
    config = json.loads((Path(model or EMBEDDED_MODEL) / "config.json").read_text())
    positions = config["max_position_embeddings"]
    table = Table(["kind", "n", "snippets chosen", "name in their lines", "name in the prompt's"])
    for kind in (*CROSS_FILE_KINDS, "all"):
        picked = [t for t in tasks if kind in ("all", t.kind)]
        chosen = shown = kept = 0
        for task in picked:
            files = ContextFiles()
            files.set_roots(f["uri"] for f in workspace.folders())
            opened = [Document(workspace.uri(p), 1, texts[p], "python") for p in task.opened]
            doc = Document(workspace.uri(task.path), 1, task.prefix + task.suffix, "python")
            workspace.write(task.path, doc.text)
            snippets = files.choose_now(doc, len(task.prefix), [*opened, doc], History(), CONTEXT_TOKENS * share // 100)
            workspace.write(task.path, texts[task.path])
            gen = MAX_TOKENS if cursor_context(task.prefix, task.suffix).on_empty_line else min(MAX_TOKENS, BLOCK)
            _, fitted = context_ids(snippets, codec, min(CONTEXT_TOKENS, positions - gen) * share // 100, True)
            chosen += bool(snippets)
            shown += any(task.name in s.text for s in snippets)
            kept += any(task.name in s.text for s in fitted)
        table.add(kind, len(picked), chosen, shown, kept)
    return table


def eval_cross_file_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llada-lab eval-infill --cross-file", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cross-file", action="store_true", help="(this evaluation; as `eval-infill` dispatches it)")
    ap.add_argument("--n", type=int, default=130, help="cross-file tasks per kind (default: %(default)s; fewer "
                    "when the split has fewer such lines)")  # fmt: skip
    ap.add_argument("--single-file-n", type=int, default=60,
                    help="single-file held-out tasks per kind, asked with other files open (default: %(default)s; 0: none)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1234, help="which tasks are cut (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="each server's model threads (default: %(default)s)")
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--context-share", type=int, default=None,
                    help="contextFilesShare for the 'on' server, percent of the prompt (default: the server's)")  # fmt: skip
    ap.add_argument("--engine-service", action="store_true",
                    help="each server's model in its own engine service, to read its prefix-cache hit rate")  # fmt: skip
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CACHE,
                    help="the corpus folder: its held-out third-party split is cut, its training split completes "
                         "each package's workspace (default: %(default)s)")  # fmt: skip
    ap.add_argument("--coverage", action="store_true",
                    help="no model run: only whether the server's chooser brings the answer's name into the "
                         "snippets and into the prompt's share of them (seconds, not minutes)")  # fmt: skip
    add_markdown_argument(ap)
    args = ap.parse_args(argv)
    paths = {split: args.corpus / SPLIT_FILES[split] for split in ("heldout-thirdparty", "train")}
    for split, path in paths.items():
        if not path.is_file():
            print(f"{ap.prog}: no {split} split at {path} (build it with `llada-lab corpus`)", file=sys.stderr)
            return 2
    current = load(paths["heldout-thirdparty"])
    packages = group_by_package(current, load(paths["train"]))
    splits = {"cross-file": make_cross_file_tasks(current, packages, args.n, args.seed)}
    if args.single_file_n:
        splits["single-file"] = single_file_tasks(current, packages, args.single_file_n, args.seed)
    texts = {f.path: f.text for files in packages.values() for f in files}
    if args.coverage:
        from llada_lsp.server.settings import Settings

        share = Settings().context_files_share if args.context_share is None else args.context_share
        with tempfile.TemporaryDirectory(prefix="llada-cross-file-") as tmp:
            workspace = Workspace(Path(tmp) / "workspace", packages)
            table = coverage(splits["cross-file"], workspace, texts, args.model, share)
        caption = (f"The chooser on the cross-file tasks (no model run): contextFilesShare {share}, tokenizer and "
                   f"positions of {args.model or 'the embedded model'}, seed {args.seed}")  # fmt: skip
        print(caption, table.text(), sep="\n")
        if args.markdown:
            out = Report("Context from other files: what the chooser brings")
            out.table(table, caption + ".")
            out.write(args.markdown)
        return 0
    model = ["--model", args.model] if args.model else []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="llada-cross-file-") as tmp:
        workspace = Workspace(Path(tmp) / "workspace", packages)
        engines, commands = {}, {}
        share = {} if args.context_share is None else {"contextFilesShare": args.context_share}
        for name, options in ((name, {**options, **share} if options["contextFiles"] else options)
                              for name, options in CONFIGS.items()):  # fmt: skip
            engine = "local"
            if args.engine_service:
                engine = f"unix:{Path(tmp) / name}.sock"
                engines[name] = (engine, [sys.executable, "-m", "llada_lsp", "engine", "--threads", str(args.threads),
                                          *model])  # fmt: skip
            commands[name] = ([sys.executable, "-m", "llada_lsp", "--engine", engine, "--threads", str(args.threads),
                               *model], options)  # fmt: skip
        answers, rates = asyncio.run(run_all(commands, splits, workspace, texts, engines))
    counts = ", ".join(f"{split} {len(tasks)}" for split, tasks in splits.items())
    caption = ("Cross-file infill through the real server (stdio), contextFiles on vs off"
               + (f" (contextFilesShare {args.context_share})" if args.context_share is not None else "") + ": model "
               f"{args.model or 'embedded'}, seed {args.seed}, tasks {counts}, server threads {args.threads}, "
               f"{time.time() - started:.0f} s")  # fmt: skip
    table, notes = report(splits, answers)
    if rates:
        notes.append("Prefix-cache hit rate (whole prompt blocks found / looked up, each configuration's engine "
                     "service): " + ", ".join(f"{name} {'-' if r is None else f'{r:.1%}'}" for name, r in rates.items()))  # fmt: skip
    else:
        notes.append("Prefix-cache hit rate: not reachable from the LSP with the in-process engine (llada.status "
                     "does not report it); `--engine-service` reads it from each configuration's engine service.")  # fmt: skip
    print(caption, table.text(), "", *notes, sep="\n")
    if args.markdown:
        out = Report("Context from other files (cross-file infill)")
        out.table(table, caption + ". Latency from the request to its answer, client side, on this machine.")
        out.note("\n".join(f"- {line}" for line in notes))
        out.write(args.markdown)
    return 0
