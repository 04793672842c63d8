"""A seeded editing fuzzer for the VS Code extension in a real code-server (issue 53).

Runs random but realistic actions on a few Python files, as a user types them through the browser:
words and symbols, Enter, Backspace and Delete (also across line starts and ends), undo and redo, pasting
several lines, moving to another line or file, Escape, leaving the editor for the command palette,
waiting for the ghost text, accepting it whole (Tab), a word (Ctrl+Right) and a line (Ctrl+Alt+L), and
switching the mode (LLaDA: Toggle Mode), while the server's drafts and revisions arrive. The real server
runs the embedded model.

After every action a key bound to the extension's test hook (editors/vscode/src/testHook.ts, on only
when LLADA_VSCODE_TEST_LOG names its log) snapshots the open files and the cursor in the extension host,
after everything typed before it. Each action is then checked:
- no error in the extension host's logs or the "LLaDA" output, and no error notification;
- every answer the extension gave VS Code inserts at the cursor (an empty range there, or none), inside
  the cursor line's bounds of the document as it is when given, as plain text;
- the files changed only as the keys say (typing inserts what was typed at the cursor, Backspace and
  Delete remove one character, paste inserts the clipboard, undo and redo give back a text the file had
  before, moving, Escape, switching files or mode change no text);
- an accept inserts at the cursor exactly what was on screen (Tab: the whole ghost text, and the
  extension was told of the accept; a word or a line: a start of it). Tab with nothing accepted inserts
  only whitespace (the indentation it types).

The actions are drawn from the seed alone, so a seed replays the same keys; what the server answers
when depends on the machine's speed. On a failure the seed, the action and the last actions are printed.

Usage: python tests/e2e/vscode/fuzz.py [--actions N] [--seed S] [--folder DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import test_vscode as vs  # noqa: E402

FILES = {
    "shapes.py": (
        "import math\n\n\nclass Circle:\n    def __init__(self, radius):\n        self.radius = radius\n\n"
        "    def area(self):\n        return math.pi * self.radius ** 2\n\n\ndef largest(circles):\n"
        "    best = None\n    for c in circles:\n        \n    return best\n"
    ),
    "words.py": "import sys\n\ntext = sys.stdin.read()\nwords = text.split()\ncounts = {}\nfor w in words:\n    \n",
    "total.py": "def total(values):\n    result = 0\n    for v in values:\n        result += v\n    return result\n\n\n",
}
MARK_KEY = "Control+Alt+Shift+F9"
SETTINGS = {
    # Backspace in indentation removes one space, as the check expects (not a tab stop's worth).
    "editor.useTabStops": False,
    "editor.autoClosingDelete": "never",
    "editor.autoClosingOvertype": "never",
    "editor.autoSurround": "never",
    "editor.formatOnPaste": False,
    # Else VS Code removes the indentation Tab typed on an empty line at the next edit elsewhere.
    "editor.trimAutoWhitespace": False,
    "editor.formatOnType": False,
    "editor.wordBasedSuggestions": "off",
    "editor.parameterHints.enabled": False,
    "editor.hover.enabled": False,
    # Next edits are Tab's too and change other lines: a fuzzer of their own would check them.
    "llada.nextEdit": False,
}
KEYBINDINGS = [
    {"key": "ctrl+alt+shift+f9", "command": "llada.test.mark"},
    # Headless Chromium makes no paste of Ctrl+V; VS Code's paste command reads the clipboard itself.
    {"key": "ctrl+alt+shift+v", "command": "editor.action.clipboardPasteAction"},
]

WORDS = ["self", "value", "radius", "count", "result", "words", "item", "name", "total", "x", "i", "len",
         "return", "print", "def", "for", "in", "if", "else", "None", "True", "math", "sqrt", "append"]  # fmt: skip
FRAGMENTS = ["self.", "return ", "for i in range(", "x = ", "print(", "import os", "if x:", "c.", "text.",
             "values[0]", "result += ", "def f(a, b):", "# note", "counts[w] = "]  # fmt: skip
SYMBOLS = list("()[]{}:.,=+-*/<>#'\"_ 0123456789")
PASTES = [
    "x = 1\ny = 2\n",
    "def helper(a):\n    return a * 2\n",
    "for k in range(3):\n    print(k)\n    total = k\n",
    "# a comment\n",
    "if value is None:\n    value = 0\nelse:\n    value += 1",
]
# (action, weight)
ACTIONS = [
    ("type_word", 14), ("type_fragment", 10), ("type_symbol", 8), ("enter", 4), ("backspace", 10),
    ("delete", 5), ("line_start_backspace", 3), ("line_end_delete", 2), ("undo", 5), ("redo", 3),
    ("paste", 4), ("goto_line", 6), ("arrows", 6), ("switch_file", 3), ("escape", 4), ("focus_away", 2),
    ("wait_ghost", 10), ("accept", 8), ("accept_word", 5), ("accept_line", 4), ("toggle_mode", 1),
    ("pause", 4),
]  # fmt: skip


class FuzzFailure(AssertionError):
    pass


def misplaced(place: dict) -> str | None:
    """What is wrong with where the ghost text is drawn (driver.mjs ghostPlace), None when nothing is."""
    cursor, inline, below, line = place["cursor"], place["inline"], place["below"], place["lineHeight"]
    if cursor is None or cursor["height"] == 0 or line is None or (inline is None and below is None):
        return None  # no cursor drawn (the editor has no focus), or no ghost text
    if inline is not None:
        if abs(inline["top"] - cursor["top"]) > line / 2:
            return "its inline part is on another line than the cursor"
        if abs(inline["left"] - cursor["left"]) > 4:
            return f"its inline part starts {inline['left'] - cursor['left']:+.0f} px from the caret"
    elif not (line / 2 < below["top"] - cursor["top"] < 1.5 * line):
        return "its lines start elsewhere than under the cursor's line"
    return None


def draw(rng: random.Random) -> list[tuple[str, Any]]:
    """One action as the primitive steps it takes, each checked on its own: (kind, argument)."""
    kind = rng.choices([a for a, _ in ACTIONS], weights=[w for _, w in ACTIONS])[0]
    if kind == "type_word":
        return [("type", rng.choice(WORDS) + rng.choice(["", "", " ", ".", "(", "_"]))]
    if kind == "type_fragment":
        return [("type", rng.choice(FRAGMENTS))]
    if kind == "type_symbol":
        return [("type", rng.choice(SYMBOLS))]
    if kind == "enter":
        return [("type", "\n")]
    if kind == "backspace":
        return [("backspace", rng.randint(1, 3))]
    if kind == "delete":
        return [("delete", rng.randint(1, 2))]
    if kind == "line_start_backspace":
        return [("goto", (rng.randint(1, 25), "start")), ("backspace", 1)]
    if kind == "line_end_delete":
        return [("goto", (rng.randint(1, 25), "end")), ("delete", 1)]
    if kind == "paste":
        return [("paste", rng.choice(PASTES))]
    if kind == "goto_line":
        return [("goto", (rng.randint(1, 25), rng.choice(["start", "end", "end"])))]
    if kind == "arrows":
        keys = rng.choices(["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Home", "End"], k=rng.randint(1, 4))
        return [("keys", keys)]
    if kind == "switch_file":
        return [("switch", rng.choice(sorted(FILES)))]
    if kind == "pause":
        return [("pause", round(rng.uniform(0.1, 1.0), 2))]
    return [(kind, None)]


@dataclass
class Mark:
    active: str | None
    cursor: tuple[int, int] | None
    documents: dict[str, dict]

    def text(self) -> str:
        return self.documents[self.active]["text"] if self.active in self.documents else ""

    def offset(self) -> int:
        assert self.cursor is not None
        line, character = self.cursor
        lines = self.text().split("\n")
        return sum(len(x) + 1 for x in lines[:line]) + character


@dataclass
class HookLog:
    path: Path
    offset: int = 0
    records: list[dict] = field(default_factory=list)

    def read(self) -> list[dict]:
        """The records written since the last read (complete lines only)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        new = [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]
        self.records.extend(new)
        return new


SERVER_NOTICE = re.compile(r"\[error\] llada-lsp (DEBUG|INFO|WARNING) ")


class LogWatch:
    """New lines with errors in the extension host's logs and the LLaDA output (not its trace)."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.offsets: dict[Path, int] = {}

    def _files(self) -> list[Path]:
        found = [p for p in self.logs.glob("**/*.log") if "exthost" in p.name or p.name.endswith("LLaDA.log")]
        return [p for p in found if "Trace" not in p.name]

    def errors(self) -> list[str]:
        found = []
        for path in self._files():
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            for line in data.decode(errors="replace").splitlines():
                # The client writes the server's stderr at error level; the server's own level says more.
                if SERVER_NOTICE.search(line):
                    continue
                if "[error]" in line or "Traceback" in line or "Exception" in line:
                    found.append(f"{path.name}: {line}")
        return found


class Fuzzer:
    def __init__(self, root: Path, step_delay_ms: str = "60"):
        tools = vs.find_tools()
        vsix = vs.extension_vsix(str(Path(tools["LLADA_E2E_NODE"]).parent))
        self.root = root
        self.hook = HookLog(root / "hook.log")
        self.editor = vs.VSCode(
            root, tools, vsix, files=FILES, settings=SETTINGS, keybindings=KEYBINDINGS,
            env={"LLADA_VSCODE_TEST_LOG": str(self.hook.path), "LLADA_LSP_TEST_STEP_DELAY_MS": step_delay_ms},
        )  # fmt: skip
        self.uris = {name: (self.editor.workspace / name).as_uri() for name in FILES}
        self.history: dict[str, list[str]] = {self.uris[n]: [t] for n, t in FILES.items()}
        self.logs = LogWatch(self.editor.user / "logs")
        self.counts: dict[str, int] = {}
        self.accepted = {"whole": 0, "word": 0, "line": 0}
        self.served = 0
        self.served_at: dict[tuple, list[str]] = {}
        self.mark: Mark | None = None
        # The hook's records up to the last snapshot are checked; the mark's index in them.
        self.consumed = 0
        self.mark_index = 0

    def close(self) -> None:
        self.editor.close()

    def start(self) -> None:
        """Opens the first file, waits for the server, and takes the first snapshot."""
        name = sorted(FILES)[0]
        self.editor.open(name)
        self.editor.wait(lambda: "LLaDA" in self.editor.status(), "the LLaDA status item", detail=self.editor.status)
        self.logs.errors()  # what code-server logged while starting is not the extension's editing
        self.mark = self.snapshot()
        assert self.mark.active == self.uris[name], self.mark

    def snapshot(self) -> Mark:
        """Presses the mark key and returns the extension host's snapshot, taken after every key before."""
        self.hook.read()
        start = len(self.hook.records)  # every mark before the key is read
        self.editor.press(MARK_KEY)
        deadline = time.monotonic() + vs.WAIT_S
        while True:
            self.hook.read()
            marks = [i for i in range(start, len(self.hook.records)) if self.hook.records[i]["event"] == "mark"]
            if marks:
                self.mark_index = marks[0]
                m = self.hook.records[self.mark_index]
                return Mark(m["active"], tuple(m["cursor"]) if m["cursor"] else None, m["documents"])
            if time.monotonic() > deadline:
                raise FuzzFailure(f"no snapshot from the extension within {vs.WAIT_S:.0f} s of the mark key")
            time.sleep(0.02)

    # The steps.

    def run_step(self, kind: str, arg: Any) -> None:
        ed = self.editor
        before = self.mark
        assert before is not None
        ghost = ""
        if kind == "type":
            ed.browser("type", text=arg, delay=15)
        elif kind == "backspace":
            ed.press(*["Backspace"] * arg)
        elif kind == "delete":
            ed.press(*["Delete"] * arg)
        elif kind == "goto":
            line, where = arg
            ed.press("Control+G")
            ed.type(str(line))
            ed.press("Enter")
            if where == "end":
                ed.press("End")
        elif kind == "keys":
            ed.press(*arg)
        elif kind == "switch":
            ed.open(arg)
        elif kind == "paste":
            ed.browser("paste", text=arg, key="Control+Alt+Shift+V")
            # The paste command reads the clipboard asynchronously: a key pressed after it can run first.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                r["event"] == "change" for r in self.hook.records[self.consumed :]
            ):
                self.hook.read()
                time.sleep(0.05)
        elif kind == "undo":
            ed.press("Control+Z")
        elif kind == "redo":
            ed.press("Control+Shift+Z")
        elif kind == "escape":
            ed.press("Escape")
        elif kind == "focus_away":
            # The command palette takes the focus; Escape gives it back to the editor.
            ed.press("F1")
            ed.browser("quickInput")
            ed.press("Escape")
        elif kind == "wait_ghost":
            self.wait_ghost(2.5)
        elif kind == "pause":
            time.sleep(arg)
        elif kind in ("accept", "accept_word", "accept_line"):
            # A user accepts what is on screen: up to a second and a half to see something.
            ghost = self.wait_ghost(1.5)
            ed.press({"accept": "Tab", "accept_word": "Control+ArrowRight", "accept_line": "Control+Alt+L"}[kind])
        elif kind == "toggle_mode":
            ed.browser("command", title="LLaDA: Toggle Mode")
        else:
            raise ValueError(kind)
        after = self.snapshot()
        new = self.hook.records[self.consumed : self.mark_index + 1]
        self.check(kind, arg, before, after, new, ghost)
        self.consumed = self.mark_index + 1
        self.mark = after

    def wait_ghost(self, seconds: float) -> str:
        """The ghost text on screen once there is some, or '' after {seconds}."""
        deadline = time.monotonic() + seconds
        while not (ghost := self.editor.ghost()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return ghost

    # The checks.

    def check(self, kind: str, arg: Any, before: Mark, after: Mark, new: list[dict], ghost: str) -> None:
        errors = self.logs.errors()
        if errors:
            raise FuzzFailure("errors logged:\n" + "\n".join(errors[:20]))
        toasts = [t for t in self.editor.browser("toasts") if t["severity"] == "error"]
        if toasts:
            raise FuzzFailure(f"error notifications: {toasts!r}")
        self.check_ghost_place()
        # The texts the file had before this step (undo and redo must give back one of them).
        past = set(self.history.get(before.active or "", []))
        for record in new:
            if record["event"] == "served":
                self.check_served(record)
            elif record["event"] == "change":
                self.history.setdefault(record["uri"], []).append(record["text"])
        # Every file but the one edited keeps its text; a file opened since holds what is on disk.
        for uri, doc in after.documents.items():
            if uri not in self.uris.values():
                continue  # not a workspace file (settings.json, which the mode command writes)
            if uri == before.active and kind not in ("switch",):
                continue
            old = before.documents.get(uri)
            expected = old["text"] if old is not None else self._disk(uri)
            if expected is not None and doc["text"] != expected:
                raise FuzzFailure(f"{uri} changed by {kind} though it was not edited: {expected!r} -> {doc['text']!r}")
        if kind == "switch":
            return
        if after.active != before.active:
            raise FuzzFailure(f"{kind} left the file {before.active} for {after.active}")
        old, now = before.text(), after.text()
        o = before.offset()
        if kind == "type":
            start = old.rfind("\n", 0, o) + 1
            if arg in ")]}" and old[start:o].strip() == "" and now != old[:o] + arg + old[o:]:
                # A closing bracket typed after the indentation alone re-indents the line (VS Code's
                # electric characters, whatever editor.autoIndent says): the indentation may change.
                indent = now[start : len(now) - len(old[o:]) - len(arg)]
                if indent.strip() == "":
                    self.expect(kind, now, old[:start] + indent + arg + old[o:], after, start + len(indent) + 1)
                    return
            self.expect(kind, now, old[:o] + arg + old[o:], after, o + len(arg))
        elif kind in ("backspace", "delete"):
            text = old
            for _ in range(arg):
                if kind == "backspace" and o > 0:
                    text, o = text[: o - 1] + text[o:], o - 1
                elif kind == "delete" and o < len(text):
                    text = text[:o] + text[o + 1 :]
            self.expect(kind, now, text, after, o)
        elif kind == "paste":
            self.expect(kind, now, old[:o] + arg + old[o:], after, o + len(arg))
        elif kind in ("undo", "redo"):
            if now != old and now not in past:
                raise FuzzFailure(f"{kind} gave a text the file never had: {old!r} -> {now!r}")
        elif kind in ("accept", "accept_word", "accept_line"):
            self.check_accept(kind, before, after, new, ghost)
        elif now != old:
            raise FuzzFailure(f"{kind} changed the text: {old!r} -> {now!r}")

    def check_ghost_place(self) -> None:
        """Ghost text on screen is drawn at the cursor: its inline part starts at the caret, on its line;
        lines of it alone start on the line under the caret. A frame can lag the cursor (VS Code hides the
        ghost text when told by the extension host): a misplacement counts when it lasts a second."""
        deadline = time.monotonic() + 1.0
        while True:
            place = self.editor.browser("ghostPlace")
            problem = misplaced(place)
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise FuzzFailure(f"ghost text {self.editor.ghost()!r} away from the cursor: {problem} ({place})")
            time.sleep(0.1)

    def expect(self, kind: str, now: str, expected: str, after: Mark, offset: int) -> None:
        if now != expected:
            raise FuzzFailure(f"after {kind} the file is {now!r}, the keys give {expected!r}")
        if after.offset() != offset:
            raise FuzzFailure(
                f"after {kind} the cursor is at {after.cursor} (offset {after.offset()}), expected {offset}"
            )

    def check_served(self, record: dict) -> None:
        items = record["items"] or []
        if items:
            self.served += 1
        key = (record["uri"], record["version"], record["line"], record["character"])
        if not record["cancelled"]:
            self.served_at.setdefault(key, []).extend(i["text"] for i in items if isinstance(i["text"], str))
        here = [record["line"], record["character"]]
        where = f"served at {here} of {record['uri']} v{record['version']}: {items!r}"
        if not items or record["cancelled"]:
            return  # nothing, or nothing VS Code shows
        if record["line"] >= record["lineCount"] or record["character"] > record["lineLength"]:
            raise FuzzFailure(f"an item outside the line (the line has {record['lineLength']} characters): {where}")
        for item in items:
            if not isinstance(item["text"], str):
                raise FuzzFailure(f"a snippet, which inserts other text than it shows: {where}")
            if item["range"] is not None and (item["range"]["start"] != here or item["range"]["end"] != here):
                raise FuzzFailure(f"an item that replaces text, not at the cursor: {where}")

    def check_accept(self, kind: str, before: Mark, after: Mark, new: list[dict], ghost: str) -> None:
        old, now = before.text(), after.text()
        o = before.offset()
        if now == old:
            return
        inserted = now[o : o + len(now) - len(old)]
        if len(now) < len(old) or old[:o] + inserted + old[o:] != now:
            raise FuzzFailure(f"{kind} changed the text other than by inserting at the cursor: {old!r} -> {now!r}")
        # What was on screen: the ghost text read just before the key (the page loses a line break at its
        # end), or an item served for this text of the file at this cursor (one may come after the read).
        version = before.documents[before.active]["version"]
        served = self.served_at.get((before.active, version, *before.cursor), [])
        ghost_match = ghost != "" and (
            inserted.rstrip("\n") == ghost if kind == "accept" else ghost.startswith(inserted.rstrip("\n"))
        )
        served_match = any(inserted == t if kind == "accept" else t.startswith(inserted) for t in served)
        accepted = any(r["event"] == "accepted" for r in new)
        if kind == "accept" and not accepted and inserted.strip() != "":
            # VS Code runs the item's command after inserting it: give it a moment to arrive.
            time.sleep(0.5)
            self.hook.read()
            accepted = any(r["event"] == "accepted" for r in self.hook.records[self.consumed :])
        if kind == "accept" and not accepted:
            if inserted.strip() == "":
                return  # Tab with nothing on screen indents
            raise FuzzFailure(f"Tab inserted {inserted!r} but the extension was told of no accept")
        if not (ghost_match or served_match):
            raise FuzzFailure(f"{kind} inserted {inserted!r}; on screen was {ghost!r}, served there {served!r}")
        self.accepted[{"accept": "whole", "accept_word": "word", "accept_line": "line"}[kind]] += 1

    def _disk(self, uri: str) -> str | None:
        for name, u in self.uris.items():
            if u == uri:
                return FILES[name]
        return None


def run(seed: int, actions: int, folder: Path, out=sys.stdout) -> dict:
    """Runs {actions} actions drawn from {seed}; raises FuzzFailure naming the seed on the first fault."""
    rng = random.Random(seed)
    fuzzer = Fuzzer(folder)
    started = time.monotonic()
    done: list[tuple[str, Any]] = []
    try:
        fuzzer.start()
        for n in range(actions):
            steps = draw(rng)
            for kind, arg in steps:
                done.append((kind, arg))
                fuzzer.counts[kind] = fuzzer.counts.get(kind, 0) + 1
                try:
                    fuzzer.run_step(kind, arg)
                except (FuzzFailure, AssertionError, pytest.fail.Exception) as failure:
                    tail = "\n".join(f"  {k} {a!r}" for k, a in done[-12:])
                    raise FuzzFailure(
                        f"seed {seed}, action {n + 1} of {actions} ({kind} {arg!r}): {failure}\n"
                        f"the last steps:\n{tail}\nreplay: python tests/e2e/vscode/fuzz.py --seed {seed} "
                        f"--actions {n + 1}\n(the run's files: {folder})"
                    ) from None
            if (n + 1) % 100 == 0:
                print(f"seed {seed}: {n + 1} actions, {time.monotonic() - started:.0f} s", file=out, flush=True)
    finally:
        fuzzer.close()
    return {
        "seed": seed, "actions": actions, "steps": len(done), "seconds": round(time.monotonic() - started, 1),
        "served": fuzzer.served, "accepted": fuzzer.accepted, "counts": fuzzer.counts,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--actions", type=int, default=5000, help="how many actions (default 5000)")
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: drawn, and printed)")
    parser.add_argument(
        "--folder", type=Path, default=None, help="where code-server's files go (default: a new temporary folder)"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="llada-vscode-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}, {args.actions} actions, files in {folder}", flush=True)
    try:
        summary = run(seed, args.actions, folder)
    except pytest.skip.Exception as skipped:
        print(f"skipped: {skipped.msg}", file=sys.stderr)
        return 2
    except FuzzFailure as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    # Stopped by a signal, the run still closes code-server and the browser (its own process group).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
