"""A seeded editing fuzzer in a real headless Neovim with the llada plugin and the real server (issue 53).

A run is a sequence of random but realistic actions on a few Python files: typing words and symbols,
Enter, Backspace and Delete (also across line starts), undo and redo, pasting several lines, moving the
cursor on the line, to another line or to another file (also from insert mode), leaving insert mode,
accepting the whole suggestion, a word (<M-Right>) or a line (<M-C-Right>), dismissing it, switching
the mode (:LladaMode) and waiting while drafts and revisions arrive (each denoising step of the server is
slowed by the test hook, so they land between keys). After every action:

- the editor said no error (`:messages`, v:errmsg: autocommands, callbacks, scheduled code);
- no ghost text is off the cursor's line, past a line's end, or shown outside insert mode;
- every buffer changed only as the action's keys change it (exactly for typing, pasting and accepts;
  for Backspace, Delete, Enter and leaving insert mode, only whitespace or the characters deleted;
  undo and redo go back to a text the buffer had), and not at all while the run waits;
- an accept inserted exactly what was on screen when its key was read.

Each action's number of new undo states is kept: one that makes more than one (an undo step ending inside
it) is named on a failure and in the figures, since undo and redo can then reach a text no action left;
--log FILE writes every action with its buffers' undo states.

The same seed makes the same random draws (which actions a run takes also depends on when ghost text
lands, so a replay of a long run may part from it); a failure names the seed, the action's number and the last
actions. `python tests/e2e/fuzz_nvim.py --help` runs it from the command line (the long runs);
tests/e2e/test_nvim_fuzz.py runs short ones with fixed seeds.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvim_helpers import Editor, nvim_binary  # noqa: E402

FILES = {
    "shapes.py": (
        "import math\n\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def norm(self):\n        return math.sqrt(self.x * self.x + self.y * self.y)\n\n\n"
        "def average(values):\n    total = sum(values)\n    return total / len(values)\n"
    ),
    "stats.py": (
        "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef variance(xs):\n    m = mean(xs)\n"
        "    return sum((x - m) ** 2 for x in xs) / len(xs)\n"
    ),
    "greet.py": 'def greet(name):\n    message = "Hello, " + name\n    print(message)\n    return message\n',
}

# Words whose typing Python's indent rules leave as typed (no `else`, `elif`, `except`, `finally`).
WORDS = ["self", "return", "value", "values", "x", "total", "len", "print", "for", "in", "range", "result",
         "items", "count", "if", "not", "None", "def", "name", "data", "math", "sqrt", "mean"]  # fmt: skip
SYMBOLS = ["(", ")", ".", ",", " = ", " + ", "[", "]", "0", "1", " ", "'", '"', " * ", "_"]
PASTES = [
    "total = 0\nfor v in values:\n    total += v\n",
    "    def area(self):\n        return self.x * self.y\n",
    "import os\nimport sys\n",
    "x = 1\ny = 2\n",
]
ACCEPT_KEYS = {"tab": "<Tab>", "word": "<M-Right>", "line": "<M-C-Right>"}

# The fuzzer's own Lua in the editor: the ghost text and the buffer as they are when an accept key's
# mapping runs (the plugin's mappings are wrapped: the snapshot is taken right before the plugin decides),
# and a marker the run types after each action's keys (<Cmd> changes neither the mode nor the text) to
# know they have all been handled.
_FUZZ_LUA = r"""
local api = vim.api
_G.llada_fuzz = { done = 0 }
local partial = require('llada.partial')
for _, bufnr in ipairs(api.nvim_list_bufs()) do
  for _, map in ipairs(api.nvim_buf_get_keymap(bufnr, 'i')) do
    if map.desc and map.desc:find('^llada: accept') and map.callback then
      local key, run = map.lhs, map.callback
      vim.keymap.set('i', key, function()
        local ghost = llada_probe.ghost()
        local take = nil
        if ghost and not map.desc:find('^llada: accept the inline') then
          take = (map.desc:find('next word') and partial.word or partial.line)(ghost.text)
        end
        llada_fuzz.accept = { key = key, ghost = ghost, take = take,
                              lines = api.nvim_buf_get_lines(0, 0, -1, true), cursor = api.nvim_win_get_cursor(0) }
        return run()
      end, { buffer = bufnr, expr = true, desc = map.desc })
    end
  end
end
"""

_STATE_LUA = r"""
local api = vim.api
local bufs = {}
for _, b in ipairs(api.nvim_list_bufs()) do
  if api.nvim_buf_is_loaded(b) and vim.bo[b].buftype == '' and api.nvim_buf_get_name(b) ~= '' then
    bufs[#bufs + 1] = { buf = b, name = vim.fs.basename(api.nvim_buf_get_name(b)),
                        lines = api.nvim_buf_get_lines(b, 0, -1, true), undo = vim.fn.undotree(b).seq_last }
  end
end
return { mode = api.nvim_get_mode().mode, buf = api.nvim_get_current_buf(), cursor = api.nvim_win_get_cursor(0),
         bufs = bufs, ghost = llada_probe.ghost() }
"""


def nonblank(text: str) -> str:
    return re.sub(r"\s+", "", text)


@dataclass
class State:
    mode: str
    buf: int
    cursor: tuple[int, int]  # (1-based row, byte col)
    texts: dict[int, str]  # buffer -> text
    names: dict[int, str]
    ghost: dict | None
    undo: dict[int, int] = field(default_factory=dict)  # buffer -> its newest undo state's number (seq_last)

    @property
    def text(self) -> str:
        return self.texts[self.buf]

    def offset(self) -> int:
        """The cursor as an index into the current buffer's text (bytes and str agree: ASCII files)."""
        lines = self.text.split("\n")
        row, col = self.cursor
        return sum(len(line) + 1 for line in lines[: row - 1]) + col


class FuzzFailure(AssertionError):
    pass


@dataclass
class Fuzzer:
    editor: Editor
    seed: int
    path: str
    rng: random.Random = field(init=False)
    history: dict[int, set[str]] = field(default_factory=dict)  # texts each buffer had: undo goes back to one
    done: list[str] = field(default_factory=list)
    accepts: dict[str, int] = field(default_factory=dict)
    marker: int = 0
    shown: int = 0  # actions that began with ghost text on screen
    log: object = None  # a file the actions are written to, one line each
    # Actions that made more than one undo state in a buffer: (action number, name, buffer, states made)
    split: list[tuple[int, str, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.editor.lua(_FUZZ_LUA)

    # --- driving ------------------------------------------------------------------------------
    def state(self) -> State:
        raw = self.editor.lua(_STATE_LUA)
        texts = {b["buf"]: "\n".join(b["lines"]) for b in raw["bufs"]}
        names = {b["buf"]: b["name"] for b in raw["bufs"]}
        undo = {b["buf"]: b["undo"] for b in raw["bufs"]}
        return State(raw["mode"], raw["buf"], tuple(raw["cursor"]), texts, names, raw.get("ghost"), undo)

    def keys(self, keys: str) -> None:
        """Types {keys} and returns once the editor has handled them and what they scheduled."""
        self.marker += 1
        self.editor.nvim.input(keys + f"<Cmd>lua llada_fuzz.done = {self.marker}<CR>")
        deadline = time.monotonic() + 60
        while self.editor.lua("return llada_fuzz.done") != self.marker:
            if time.monotonic() > deadline:
                self.fail(f"the keys {keys!r} were not handled in 60 s (mode {self.editor.nvim.api.get_mode()!r})")
            time.sleep(0.005)
        self.editor.lua("vim.wait(10) return true")  # what the keys scheduled (an accept's edit) runs

    def fail(self, what: str) -> None:
        recent = "\n  ".join(self.done[-12:])
        split = f"\n  actions that made several undo states: {self.split[-8:]}" if self.split else ""
        raise FuzzFailure(
            f"seed {self.seed} (--path {self.path}), action {len(self.done)}: {what}\n  last actions:\n  {recent}{split}"
        )

    # --- the actions --------------------------------------------------------------------------
    def run(self, actions: int, progress: bool = False) -> None:
        before = self.state()
        for texts in before.texts.items():
            self.history.setdefault(texts[0], set()).add(texts[1])
        started = time.monotonic()
        for n in range(1, actions + 1):
            before = self.step(before)
            if progress and n % 500 == 0:
                print(f"fuzz: {n} actions, {time.monotonic() - started:.0f} s, ghost text shown at {self.shown}, "
                      f"accepts {self.accepts}", flush=True)  # fmt: skip

    def step(self, before: State) -> State:
        inserting = before.mode.startswith("i")
        self.shown += bool(before.ghost)
        choices = self.insert_actions(bool(before.ghost)) if inserting else self.normal_actions()
        names, weights = zip(*choices)
        name = self.rng.choices(names, weights)[0]
        self.editor.lua("llada_fuzz.accept = nil")
        description, expect = getattr(self, f"do_{name}")(before)
        self.done.append(f"{name}: {description}")
        after = self.state()
        for buf, seq in after.undo.items():
            made = seq - before.undo.get(buf, seq)
            if made > 1:
                self.split.append((len(self.done), name, buf, made))
        if self.log:
            print(f"{len(self.done)} buf {before.buf} mode {before.mode} -> {after.mode} undo {after.undo} "
                  f"{self.done[-1]}", file=self.log, flush=True)  # fmt: skip
        self.check(before, after, name, expect)
        for buf, text in after.texts.items():
            self.history.setdefault(buf, set()).add(text)
        return after

    @staticmethod
    def insert_actions(shown: bool) -> list[tuple[str, int]]:
        """With ghost text on screen a user takes it more often than not; without, types and waits."""
        accepts = [("accept", 14), ("accept_word", 9), ("accept_line", 6)] if shown else [("accept", 2)]
        return [("type_word", 14), ("type_symbol", 8), ("enter", 3), ("backspace", 7), ("delete", 4),
                ("arrow", 5), ("paste", 2), ("escape", 4), ("insert_undo", 1), ("insert_switch_file", 1),
                ("mode", 1), ("wait", 8), ("read", 0 if shown else 8), *accepts]  # fmt: skip

    @staticmethod
    def normal_actions() -> list[tuple[str, int]]:
        return [("enter_insert", 12), ("undo", 2), ("redo", 1), ("put_lines", 1), ("switch_file", 2),
                ("mode", 1), ("wait", 1)]  # fmt: skip

    def do_type_word(self, s: State):
        word = self.rng.choice(WORDS) + self.rng.choice(["", "", " ", "."])
        self.keys(word)
        return repr(word), ("typed", word)

    def do_type_symbol(self, s: State):
        symbol = self.rng.choice(SYMBOLS)
        self.keys(symbol.replace("<", "<lt>"))
        return repr(symbol), ("typed", symbol)

    def do_enter(self, s: State):
        self.keys("<CR>")
        return "<CR>", ("blank", "\n")

    def do_backspace(self, s: State):
        n = self.rng.choice([1, 1, 1, 2, 3])
        if self.rng.random() < 0.15:  # from the line's start: joins it to the line above
            self.keys("<Home>")
            s = self.state()
        self.keys("<BS>" * n)
        return f"<BS> x{n} at {s.cursor}", ("deleted_before", n, s)

    def do_delete(self, s: State):
        n = self.rng.choice([1, 1, 2])
        if self.rng.random() < 0.2:  # at the line's end: joins the next line to it
            self.keys("<End>")
            s = self.state()
        self.keys("<Del>" * n)
        return f"<Del> x{n} at {s.cursor}", ("deleted_after", n, s)

    def do_arrow(self, s: State):
        key = self.rng.choice(["<Left>", "<Right>", "<Up>", "<Down>", "<Home>", "<End>", "<C-Left>", "<C-Right>"])
        self.keys(key)
        return key, ("blank", "")  # leaving a line that has only its autoindent takes the indent away

    def do_paste(self, s: State):
        text = self.rng.choice(PASTES)
        self.editor.nvim.api.paste(text, True, -1)
        self.keys("")
        return repr(text), ("pasted", text)

    def _accept(self, s: State, kind: str):
        key = ACCEPT_KEYS[kind]
        if kind != "tab" and not s.ghost:
            self.keys("")  # nothing to take a word or line of: a key with no meaning here is not pressed
            return f"{key} (nothing shown: not pressed)", ("same",)
        self.keys(key)
        seen = self.editor.lua("return llada_fuzz.accept")
        self.accepts[kind] = self.accepts.get(kind, 0) + int(bool(seen and seen.get("ghost")))
        return f"{key} with {seen and seen.get('ghost')!r}", ("accepted", seen)

    def do_accept(self, s: State):
        return self._accept(s, "tab")

    def do_accept_word(self, s: State):
        return self._accept(s, "word")

    def do_accept_line(self, s: State):
        return self._accept(s, "line")

    def do_escape(self, s: State):
        self.keys("<Esc>")
        return "<Esc> (dismiss, leave insert mode)", ("blank", "")

    def do_insert_undo(self, s: State):
        self.keys("<C-o>u")
        return "<C-o>u", ("undone",)

    def do_insert_switch_file(self, s: State):
        other = self.rng.choice([b for b in s.texts if b != s.buf] or [s.buf])
        self.keys(f"<C-o>:buffer {other}<CR>")
        return f"<C-o>:buffer {other} ({s.names.get(other)})", ("blank", "")

    def do_mode(self, s: State):
        mode = self.rng.choice(["speed", "quality"])
        self.keys(f"<Cmd>LladaMode {mode}<CR>")
        return f":LladaMode {mode}", ("same",)

    def do_wait(self, s: State):
        seconds = self.rng.choice([0.05, 0.2, 0.4, 0.8, 1.5])
        time.sleep(seconds)
        self.keys("")
        return f"{seconds}s", ("same",)

    def do_read(self, s: State):
        """A pause to read a suggestion: until ghost text is shown, or 3 s."""
        deadline = time.monotonic() + 3
        while not self.editor.ghost() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.keys("")
        return f"{3 - max(0.0, deadline - time.monotonic()):.2f}s until ghost text", ("same",)

    def do_enter_insert(self, s: State):
        lines = s.text.split("\n")
        row = self.rng.randrange(len(lines)) + 1 if self.rng.random() < 0.7 else s.cursor[0]
        how = self.rng.choice(["A", "A", "A", "I", "i", "a", "o", "O"])
        col = self.rng.randrange(len(lines[row - 1]) + 1)
        if how in "ia" and col:
            keys = f"{row}G0{col}l{how}" if col > 1 else f"{row}G0{how}"
        else:
            keys = f"{row}G{how}"
        self.keys(keys)
        return keys, ("blank", "\n") if how in "oO" else ("same",)

    def do_undo(self, s: State):
        self.keys("u")
        return "u", ("undone",)

    def do_redo(self, s: State):
        self.keys("<C-r>")
        return "<C-r>", ("undone",)

    def do_put_lines(self, s: State):
        text = self.rng.choice(PASTES)
        self.editor.lua("vim.fn.setreg('z', ..., 'l')", text.rstrip("\n").split("\n"))
        self.keys('"zp')
        return f'"zp {text!r}', ("put", text)

    def do_switch_file(self, s: State):
        other = self.rng.choice([b for b in s.texts if b != s.buf] or [s.buf])
        self.keys(f":buffer {other}<CR>")
        return f":buffer {other} ({s.names.get(other)})", ("same",)

    # --- the checks ---------------------------------------------------------------------------
    def check(self, before: State, after: State, name: str, expect: tuple) -> None:
        errors = self.editor.errors()
        if errors:
            self.fail("the editor said an error:\n    " + "\n    ".join(errors))
        problems = self.editor.ghost_problems()
        if problems:
            self.fail("ghost text out of place:\n    " + "\n    ".join(problems))
        for buf, text in after.texts.items():
            if buf != before.buf and text != before.texts.get(buf, text):
                self.fail(f"buffer {after.names[buf]} changed though the keys went to another one")
        old, new = before.text, after.texts[before.buf]
        kind = expect[0]
        if kind == "same":
            ok = new == old
        elif kind == "typed":
            at = before.offset()
            # Exactly, unless Python's indent rules re-indented the line (a `)` typed first on it).
            ok = new == old[:at] + expect[1] + old[at:] or nonblank(new) == nonblank(old[:at] + expect[1] + old[at:])
        elif kind == "pasted":
            at = before.offset()
            ok = nonblank(new) == nonblank(old[:at] + expect[1] + old[at:])
        elif kind == "put":
            lines = old.split("\n")
            row = before.cursor[0]
            ok = new.split("\n") == lines[:row] + expect[1].rstrip("\n").split("\n") + lines[row:]
        elif kind == "blank":  # Enter, o, O, <Esc>: only whitespace changes
            ok = nonblank(new) == nonblank(old)
        elif kind in ("deleted_before", "deleted_after"):
            n, at_key = expect[1], expect[2]
            old, at = at_key.text, at_key.offset()
            ok = self.deleted(old, new, at, n, kind == "deleted_before")
        elif kind == "undone":
            ok = new in self.history.get(before.buf, set())
        elif kind == "accepted":
            ok = self.accepted(old, new, expect[1])
        else:
            raise ValueError(kind)
        if not ok:
            self.fail(f"{name}: the buffer is not what the keys make of it\n    before {old!r}\n    after  {new!r}")

    @staticmethod
    def deleted(old: str, new: str, at: int, n: int, backwards: bool) -> bool:
        """{new} is {old} less a run of characters right before (or after) index {at}, with at most {n}
        of them not whitespace (Backspace may take an indent's several spaces at once)."""
        removed = len(old) - len(new)
        if removed < 0:
            return False
        start = at - removed if backwards else at
        if start < 0 or old[:start] + old[start + removed :] != new:
            return False
        return len(nonblank(old[start : start + removed])) <= n

    def accepted(self, old: str, new: str, seen: dict | None) -> bool:
        """An accept inserts what was shown when its key was read (all of it for <Tab>, its next word or
        line for the others) at the ghost text's place; with nothing shown, <Tab> is a tab."""
        if not seen:
            return False
        lines = seen["lines"]
        row, col = seen["cursor"]
        ghost = seen.get("ghost")
        at_key = "\n".join(lines)
        if at_key != old:
            return False
        offset = sum(len(line) + 1 for line in lines[: row - 1])
        if not ghost or not ghost.get("text"):  # <Tab> indents: blanks at the cursor ('expandtab' of Python)
            if seen["key"].lower() != "<tab>":
                return new == at_key  # the word and line keys mean nothing else in insert mode
            at, added = offset + col, len(new) - len(at_key)
            return (seen["key"] == "<Tab>" and added > 0 and new[:at] == at_key[:at]
                    and new[at + added :] == at_key[at:] and not new[at : at + added].strip())  # fmt: skip
        text = ghost["text"] if seen.get("take") is None else ghost["text"][: seen["take"]]
        offset = sum(len(line) + 1 for line in lines[: ghost["row"]]) + ghost["col"]
        return new == at_key[:offset] + text + at_key[offset:]


def open_files(editor: Editor, workdir: Path) -> None:
    for name, text in FILES.items():
        editor.open(name, text)


def start_editor(path: str, workdir: Path, step_delay_ms: int = 15) -> Editor:
    """The editor of a run: the plugin on {path}'s ghost text, next edits off (their <Tab> jumps and
    edits elsewhere, which the checks would have to foresee), each denoising step slowed so drafts and
    revisions land between keys."""
    binary = nvim_binary()
    if not binary:
        raise SystemExit("no nvim found (LLADA_TEST_NVIM, the virtual environment's, or PATH)")
    env = {"LLADA_LSP_TEST_STEP_DELAY_MS": str(step_delay_ms)}
    opts = {"force_fallback": path == "fallback", "next_edit": False, "inline_mode": "quality",
            "max_completion_tokens": 24}  # fmt: skip
    editor = Editor(binary, workdir, opts, env)
    try:
        open_files(editor, workdir)
        editor.clear_errors()
    except BaseException:
        editor.close()
        raise
    return editor


def fuzz(
    path: str, seed: int, actions: int, step_delay_ms: int = 15, progress: bool = False, log: str | None = None
) -> dict:
    """One run; returns its figures. Raises FuzzFailure (naming the seed) at the first broken check."""
    with tempfile.TemporaryDirectory(prefix="llada-fuzz-") as folder:
        editor = start_editor(path, Path(folder), step_delay_ms)
        try:
            started = time.monotonic()
            fuzzer = Fuzzer(editor, seed, path)
            if log:
                fuzzer.log = open(log, "w")  # noqa: SIM115 (closed below)
            try:
                fuzzer.run(actions, progress)
            finally:
                if fuzzer.log:
                    fuzzer.log.close()
            return {"path": path, "seed": seed, "actions": actions, "seconds": round(time.monotonic() - started, 1),
                    "actions with ghost text shown": fuzzer.shown, "accepts of ghost text": fuzzer.accepts,
                    "actions that made several undo states": fuzzer.split}  # fmt: skip
        finally:
            editor.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tests/e2e/fuzz_nvim.py",
        description="Seeded editing fuzzer of the llada Neovim plugin in a real headless Neovim with the real "
        "server. Exits 1 at the first broken check, printing the seed that replays it.",
    )
    parser.add_argument("--actions", type=int, default=5000, help="actions per run (default 5000)")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (default: a random one, printed)")
    parser.add_argument(
        "--path",
        choices=["builtin", "fallback", "both"],
        default="both",
        help="ghost text path: Neovim 0.12's vim.lsp.inline_completion, the plugin's own, or both",
    )
    parser.add_argument(
        "--step-delay-ms",
        type=int,
        default=15,
        help="each denoising step lasts this much longer, so drafts land between keys (default 15)",
    )
    parser.add_argument("--log", default=None, help="write each action (number, keys, undo states) to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", "")
    hooks = str(Path(__file__).resolve().parents[1] / "hooks")  # the step delay is a test hook
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (hooks, os.environ["PYTHONPATH"]) if p)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    paths = ["builtin", "fallback"] if args.path == "both" else [args.path]
    for path in paths:
        print(f"fuzz: path {path}, seed {seed}, {args.actions} actions", flush=True)
        try:
            figures = fuzz(path, seed, args.actions, args.step_delay_ms, progress=True, log=args.log)
        except FuzzFailure as failure:
            print(f"FAILED: {failure}\nreplay: python tests/e2e/fuzz_nvim.py --path {path} --seed {seed} "
                  f"--actions {args.actions}", flush=True)  # fmt: skip
            return 1
        print(f"fuzz: passed {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
