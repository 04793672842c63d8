"""End-to-end tests of the VS Code extension in a real VS Code: code-server (VS Code 1.139 from npm) with
the extension built from the tree, driven as a user would by headless Chromium (playwright-core,
tests/e2e/vscode/driver.mjs), against the real server on the embedded model, run in the server process.

tests/e2e/vscode/install.sh installs the tools into LLADA_E2E_TOOLS (default ~/.cache/llada-lsp-e2e) and
.ci/run calls it; without them every test skips, with the reason. The extension is the .vsix that
editors/vscode/ci.sh made (built again here when the sources are newer); LLADA_E2E_VSIX names another.
What the server answered is read from the extension's trace (llada.trace.server: verbose), in the
extension host's log folder. Next edits come from the scripted model of tests/hooks/scripted_next_edit.py
(the embedded model was not trained on edits). LLADA_E2E_SCREENSHOTS names a folder for the screenshots
of the ghost text and the rewrite's diff (docs/images has them).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "editors" / "vscode"
DRIVER = Path(__file__).parent / "vscode" / "driver.mjs"
TOOLS = Path(os.environ.get("LLADA_E2E_TOOLS") or Path.home() / ".cache" / "llada-lsp-e2e")
SERVER = Path(sys.executable).with_name("llada-lsp")
# Each wait for something on screen; the model's first answer includes its load.
WAIT_S = float(os.environ.get("LLADA_TEST_TIMEOUT", "60"))
# Each denoising step of the server sleeps this long, so that every draft stays on screen for a while.
STEP_DELAY_MS = "150"

pytestmark = [pytest.mark.slow]


def find_tools() -> dict[str, str]:
    """The paths install.sh wrote to tools.env; skips the test, with the reason, where one is missing."""
    env_file = TOOLS / "tools.env"
    if not env_file.is_file():
        pytest.skip(f"the VS Code e2e tools are not installed ({env_file} missing): run tests/e2e/vscode/install.sh")
    tools = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    missing = [path for path in tools.values() if not Path(path).exists()]
    if missing:
        pytest.skip(f"the VS Code e2e tools are incomplete ({', '.join(missing)}): run tests/e2e/vscode/install.sh")
    return tools


def extension_vsix(node_bin: str) -> Path:
    """The extension as a .vsix: LLADA_E2E_VSIX, or editors/vscode's own, packaged again if a source is newer."""
    if os.environ.get("LLADA_E2E_VSIX"):
        return Path(os.environ["LLADA_E2E_VSIX"])
    sources = [EXTENSION / "package.json", *EXTENSION.glob("src/*.ts")]
    built = sorted(EXTENSION.glob("*.vsix"))
    if built and built[0].stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return built[0]
    if shutil.which("npm") is None:
        pytest.skip("npm not found: the extension cannot be built (editors/vscode/ci.sh)")
    env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ['PATH']}"}
    steps = ([] if (EXTENSION / "node_modules").is_dir() else [["npm", "ci", "--no-audit", "--no-fund"]]) + [
        ["npm", "run", "package"]
    ]
    for step in steps:
        proc = subprocess.run(step, cwd=EXTENSION, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, f"{' '.join(step)} failed:\n{proc.stdout}\n{proc.stderr}"
    return sorted(EXTENSION.glob("*.vsix"))[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, detail: Callable[[], Any] | None = None):
    """Polls {predicate} until it returns something truthy, which is returned; fails after {timeout} s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f": {detail()}" if detail else ""))
        time.sleep(0.05)


class Browser:
    """driver.mjs: one JSON request per line, one answer per line."""

    def __init__(self, node: str, playwright: str, chromium: str, url: str, folder: Path):
        self._log = (folder / "driver.log").open("w")
        self._proc = subprocess.Popen(
            [node, str(DRIVER), playwright, chromium, url, str(folder)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        self._next = 0

    def __call__(self, op: str, timeout: float = WAIT_S, **args: Any) -> Any:
        self._next += 1
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(json.dumps({"id": self._next, "op": op, **args}) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        assert ready, f"the browser driver did not answer {op} within {timeout:.0f} s"
        answer = json.loads(self._proc.stdout.readline() or '{"ok": false, "error": "the driver exited"}')
        assert answer["ok"], f"{op} failed in the browser: {answer['error']}"
        return answer.get("value")

    def close(self) -> None:
        try:
            self("close", timeout=30)
        finally:
            self._proc.terminate()
            self._proc.wait(timeout=30)
            self._log.close()


# The Python files of the workspace: each test types into its own.
FILES = {
    # `self.` in a method body: the embedded model proposes an attribute (tests/e2e/test_nvim.py).
    "point.py": "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ",
    # `text.` after a read: the model proposes a method call, revised step after step (issue 41).
    "words.py": "import sys\n\ntext = sys.stdin.read()\n",
    # Mid-word: `val` completed to `values` (tests/e2e/test_emacs.py).
    "total.py": "def total(values):\n    for v in val",
    # The embedded model rewrites `a - b` to `a + b` (tests/e2e/test_emacs.py).
    "rewrite.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    # A rename the scripted next-edit model repeats at the other uses (tests/e2e/test_nvim_next_edit.py).
    "rename.py": "def total(values):\n    count = 0\n    for v in values:\n        count += v\n    return count\n",
    "rewrite2.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "warmup.py": "import os\n\n",
    "partial.py": "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ",
    "through.py": "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ",
}


class VSCode:
    """code-server with the extension installed, its workspace, and the browser showing it."""

    def __init__(
        self,
        root: Path,
        tools: dict[str, str],
        vsix: Path,
        files: dict[str, str] | None = None,
        settings: dict[str, Any] | None = None,
        keybindings: list[dict] | None = None,
        env: dict[str, str] | None = None,
    ):
        """{files}, {settings}, {keybindings} and {env} replace or add to the tests' own (the editing
        fuzzer, tests/e2e/vscode/fuzz.py, has its own)."""
        self.root = root
        self.shots = 0
        self.workspace = root / "workspace"
        self.workspace.mkdir()
        for name, text in (FILES if files is None else files).items():
            (self.workspace / name).write_text(text)
        self.user = root / "user"
        (self.user / "User").mkdir(parents=True)
        self.extensions = root / "extensions"
        self.settings: dict[str, Any] = {
            "files.autoSave": "off",
            "editor.autoClosingBrackets": "never",
            "editor.autoClosingQuotes": "never",
            "editor.autoIndent": "none",
            "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
            "editor.suggestOnTriggerCharacters": False,
            "editor.minimap.enabled": False,
            "editor.inlineSuggest.enabled": True,
            "workbench.startupEditor": "none",
            "workbench.secondarySideBar.defaultVisibility": "hidden",
            "workbench.tips.enabled": False,
            "security.workspace.trust.enabled": False,
            "telemetry.telemetryLevel": "off",
            "extensions.autoCheckUpdates": False,
            "extensions.autoUpdate": False,
            "chat.disableAIFeatures": True,
            "llada.trace.server": "verbose",
            "llada.server.path": str(SERVER),
            "llada.server.args": ["--threads", "1"],
            "llada.engine": "local",
            "llada.nextEditDelayMs": 200,
            **(settings or {}),
        }
        self.write_settings()
        # VS Code's partial accept of a line has no default key.
        (self.user / "User" / "keybindings.json").write_text(json.dumps([
            {"key": "ctrl+alt+l", "command": "editor.action.inlineSuggest.acceptNextLine",
             "when": "inlineSuggestionVisible"},
            *(keybindings or []),
        ]))  # fmt: skip
        self.env = {
            **os.environ,
            "PATH": f"{Path(tools['LLADA_E2E_NODE']).parent}{os.pathsep}{os.environ['PATH']}",
            "LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT": "1",
            "LLADA_LSP_TEST_STEP_DELAY_MS": STEP_DELAY_MS,
            **(env or {}),
        }
        code_server = tools["LLADA_E2E_CODE_SERVER"]
        dirs = ["--user-data-dir", str(self.user), "--extensions-dir", str(self.extensions)]
        subprocess.run(
            [code_server, "--install-extension", str(vsix), *dirs], env=self.env, check=True,
            capture_output=True, timeout=120,
        )  # fmt: skip
        port = free_port()
        config = root / "config.yaml"
        config.write_text(f"bind-addr: 127.0.0.1:{port}\nauth: none\ncert: false\n")
        self.server_log = (root / "code-server.log").open("w")
        self.server = subprocess.Popen(
            [code_server, "--config", str(config), *dirs, "--disable-telemetry", "--disable-update-check",
             "--disable-workspace-trust", "--disable-getting-started-override", "--ignore-last-opened",
             str(self.workspace)],
            env=self.env, stdout=self.server_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/?folder={self.workspace}"
        wait_for(lambda: self._answers(f"http://127.0.0.1:{port}/healthz"), "code-server to listen")
        self.browser = Browser(tools["LLADA_E2E_NODE"], tools["LLADA_E2E_PLAYWRIGHT"],
                               tools["LLADA_E2E_CHROMIUM"], url, root)  # fmt: skip
        self.browser("open", width=1000, height=600, timeout=120)
        # The editor alone on screen (and in the screenshots): the side bar is closed.
        self.browser("command", title="View: Toggle Primary Side Bar Visibility")

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def write_settings(self, **changes: Any) -> None:
        """The user's settings; also the machine's, where settings of machine scope (llada.server.*) are
        read in a remote window such as code-server's."""
        self.settings.update(changes)
        for scope in ("User", "Machine"):
            (self.user / scope).mkdir(parents=True, exist_ok=True)
            (self.user / scope / "settings.json").write_text(json.dumps(self.settings, indent=2))

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            os.killpg(self.server.pid, signal.SIGTERM)
            self.server.wait(timeout=30)
            self.server_log.close()

    def wait(
        self, predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, detail: Callable[[], Any] | None = None
    ):
        """wait_for, leaving a screenshot of the page in the test's folder when it times out."""
        try:
            return wait_for(predicate, what, timeout, detail)
        except pytest.fail.Exception as failure:
            self.shots += 1
            path = self.root / f"timeout-{self.shots}.png"
            self.browser("screenshot", path=str(path))
            raise pytest.fail.Exception(f"{failure.msg}\n(the page: {path})") from None

    # What the user sees.

    def status(self) -> str:
        """The LLaDA status bar item's text and label."""
        items = [i for i in self.browser("status") if "llada" in i["id"].lower() or "LLaDA" in i["label"]]
        return " | ".join(f"{i['text']} [{i['label']}]" for i in items)

    def ghost(self) -> str:
        return self.browser("ghost")

    def notifications(self) -> list[dict]:
        return self.browser("notifications")

    # What the user does.

    def open(self, name: str) -> None:
        self.browser("openFile", name=name)

    def type(self, text: str) -> None:
        self.browser("type", text=text)

    def press(self, *keys: str) -> None:
        self.browser("press", keys=list(keys))

    def saved(self, name: str) -> str:
        """Saves the active editor (Ctrl+S) and returns the file's text once written."""
        path = self.workspace / name
        before = path.stat().st_mtime_ns
        self.press("Control+S")
        # code-server truncates the file before it writes it: a read between the two saw '' on a busy
        # machine, so the save is done when the file changed and holds text again
        self.wait(lambda: path.stat().st_mtime_ns != before and path.stat().st_size > 0, f"{name} to be saved",
                  timeout=10)  # fmt: skip
        return path.read_text()

    # What the server said.

    def trace(self) -> str:
        logs = sorted(self.user.glob("logs/**/*LLaDA Trace*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def drafts(self, name: str) -> list[dict]:
        """The llada/draft notifications the extension received for {name}, in order."""
        uri = (self.workspace / name).as_uri()
        return [d for d in trace_messages(self.trace(), "llada/draft") if d.get("uri") == uri]


def trace_messages(trace: str, method: str) -> list[dict]:
    """The params of each {method} message in a vscode-languageclient verbose trace."""
    found = []
    message = rf"'{re.escape(method)}(?: - \([^)]*\))?'[^\n]*\n(?:Params|Result): (\{{.*?\n\}})"
    for match in re.finditer(message, trace, re.DOTALL):
        found.append(json.loads(match.group(1)))
    return found


@pytest.fixture(scope="module")
def vscode(tmp_path_factory) -> Iterator[VSCode]:
    tools = find_tools()
    vsix = extension_vsix(str(Path(tools["LLADA_E2E_NODE"]).parent))
    root = tmp_path_factory.mktemp("vscode")
    editor = VSCode(root, tools, vsix)
    try:
        warm_up(editor)
        yield editor
    finally:
        editor.close()


def warm_up(vscode: VSCode) -> None:
    """Types into a scratch file until VS Code asks the extension for an inline completion. In a fresh
    code-server the first typing in the first editor now and then asks none at all (2 of about 12 runs:
    no call reached the extension), which is VS Code's start, not what the tests are about."""
    vscode.open("warmup.py")
    vscode.press("Control+End")
    for _ in range(3):
        vscode.type("x")
        try:
            wait_for(lambda: "'textDocument/inlineCompletion" in vscode.trace(), "an inline completion request", 10)
            return
        except pytest.fail.Exception:
            continue
    pytest.fail("VS Code asked the extension for no inline completion in three tries")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("LLADA_E2E_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def final_draft(vscode: VSCode, name: str, line: int, character: int) -> dict | None:
    """The last final draft the server sent for the cursor at ({line}, {character}) of {name}."""
    finals = [
        d
        for d in vscode.drafts(name)
        if d["final"] and (d["range"]["start"]["line"], d["range"]["start"]["character"]) == (line, character)
    ]
    return finals[-1] if finals else None


def test_the_extension_starts_and_the_status_item_says_the_mode(vscode):
    vscode.wait(lambda: "LLaDA speed" in vscode.status(), "the status item to say the mode", detail=vscode.status)


# (file, typed at its end): three prompts with different answers.
PROMPTS = [("point.py", "self."), ("words.py", "words = text."), ("total.py", "ues")]


def cursor_after(source: str, typed: str) -> tuple[int, int]:
    lines = (source + typed).split("\n")
    return len(lines) - 1, len(lines[-1])


def type_and_wait_for_the_answer(
    vscode: VSCode, name: str, typed: str, source: str | None = None, record: bool = False
) -> dict:
    """Types {typed} at the end of {name} (its text {source}) and waits until the server's final answer
    there is on screen; returns that final draft. With {record}, what shows from the end of the typing on
    is recorded frame by frame (the driver's ghostLog)."""
    line, character = cursor_after(FILES[name] if source is None else source, typed)
    vscode.type(typed)
    if record:
        vscode.browser("recordGhost")
    final = vscode.wait(lambda: final_draft(vscode, name, line, character), "the server's final answer")
    assert final["text"].strip(), f"the model proposed nothing after {typed!r}: the test needs another prompt"
    vscode.wait(
        lambda: vscode.ghost() == final["text"],
        f"the final answer {final['text']!r} on screen",
        timeout=10,
        detail=lambda: f"on screen {vscode.ghost()!r}; drafts {[d['text'] for d in vscode.drafts(name)]!r}",
    )
    return final


@pytest.mark.parametrize(("name", "typed"), PROMPTS)
def test_on_screen_is_the_final_answer_and_tab_inserts_it(vscode, screenshots, name, typed):
    vscode.open(name)
    vscode.press("Control+End")
    final = type_and_wait_for_the_answer(vscode, name, typed, record=True)
    if name == "words.py":
        vscode.browser("screenshot", path=str(screenshots / "vscode-ghost-text.png"))
    log = [entry["text"] for entry in vscode.browser("ghostLog")]
    vscode.press("Tab")
    assert vscode.saved(name) == FILES[name] + typed + final["text"], f"on screen before Tab: {log!r}"

    # The drafts showed live: each text on screen was one the server sent, and one before the answer
    # showed where the server sent one that differs. While they only grew, no frame went blank.
    line, character = cursor_after(FILES[name], typed)
    request = [
        d["text"].rstrip()
        for d in vscode.drafts(name)
        if d["requestId"] == final["requestId"]
        and (d["range"]["start"]["line"], d["range"]["start"]["character"]) == (line, character)
    ]
    shown = log[next(i for i, t in enumerate(log) if t and t in {*request, final["text"]}) :]
    assert set(shown) - {""} <= {*request, final["text"]}, f"shown {shown!r}, the server's drafts {request!r}"
    if any(t and t != final["text"].rstrip() for t in request):
        assert len(set(shown) - {""}) > 1, f"only the answer showed: {shown!r}, the server's drafts {request!r}"
    grown = [t for t in request if t]
    if all(b.startswith(a) for a, b in zip(grown, grown[1:])):
        assert "" not in shown, f"a blank frame while the drafts only grew: {shown!r}"


def test_typing_through_a_suggestion_keeps_it_on_screen(vscode):
    """Issue 26 in the real host: typing the suggestion's first character keeps the rest on screen, with
    no frame without ghost text, until the revised answer replaces it; Tab then inserts that."""
    name, typed = "through.py", "self."
    vscode.open(name)
    vscode.press("Control+End")
    first = type_and_wait_for_the_answer(vscode, name, typed)["text"]
    assert len(first) >= 2, f"the answer {first!r} is too short to type through"
    vscode.browser("recordGhost")
    revised = type_and_wait_for_the_answer(vscode, name, first[0], source=FILES[name] + typed)["text"]
    log = [entry["text"] for entry in vscode.browser("ghostLog")]
    assert "" not in log, f"the ghost text left the screen while typing through it: {log!r}"
    assert log[0] == first, f"the first frame after typing: {log!r}"
    vscode.press("Tab")
    assert vscode.saved(name) == FILES[name] + typed + first[0] + revised


def test_vs_code_partial_accepts_take_a_word_then_a_line(vscode):
    name, typed = "partial.py", "self."
    vscode.open(name)
    vscode.press("Control+End")
    answer = type_and_wait_for_the_answer(vscode, name, typed)["text"]
    vscode.press("Control+ArrowRight")  # editor.action.inlineSuggest.acceptNextWord
    word = vscode.saved(name)[len(FILES[name] + typed) :]
    assert word and answer.startswith(word) and len(word) < len(answer), (word, answer)
    rest = type_and_wait_for_the_answer(vscode, name, "", source=FILES[name] + typed + word)["text"]
    vscode.press("Control+Alt+L")  # editor.action.inlineSuggest.acceptNextLine (keybindings.json)
    line = vscode.saved(name)[len(FILES[name] + typed + word) :]
    assert line and line == rest.split("\n")[0][: len(line)] and "\n" not in line.rstrip("\n"), (line, rest)


def select_line(vscode: VSCode, line: int) -> None:
    """Selects line {line} (1-based) from its first column to its end."""
    vscode.press("Control+G")
    vscode.type(str(line))
    vscode.press("Enter", "Shift+End")


def apply_edits(text: str, edit: dict, uri: str) -> str:
    """{text} after the workspace edit's text edits for {uri} (positions in a one-byte-per-character text)."""
    edits = [
        e for change in edit.get("documentChanges", []) if change["textDocument"]["uri"] == uri for e in change["edits"]
    ]
    edits += edit.get("changes", {}).get(uri, [])
    lines = text.split("\n")
    offset = lambda p: sum(len(x) + 1 for x in lines[: p["line"]]) + p["character"]  # noqa: E731
    for e in sorted(edits, key=lambda e: offset(e["range"]["start"]), reverse=True):
        text = text[: offset(e["range"]["start"])] + e["newText"] + text[offset(e["range"]["end"]) :]
    return text


def rewrite_line(vscode: VSCode, name: str, line: int) -> dict:
    """Runs LLaDA: Rewrite Selection on line {line} of {name} with no instruction and waits for the
    question after the diff; returns the edit the server proposed."""
    vscode.open(name)
    select_line(vscode, line)
    vscode.browser("command", title="LLaDA: Rewrite Selection")
    vscode.wait(lambda: vscode.browser("quickInput") == "LLaDA: Rewrite Selection", "the instruction's input box")
    vscode.press("Enter")  # no instruction
    uri = (vscode.workspace / name).as_uri()
    question = vscode.wait(
        lambda: next((n for n in vscode.notifications() if "Apply" in n["buttons"]), None),
        "the Apply/Discard question",
        detail=lambda: f"notifications {vscode.notifications()!r}",
    )
    assert question["message"].startswith("LLaDA: ") and question["buttons"] == ["Apply", "Discard"], question
    assert vscode.browser("diffShown"), "the proposal is shown as a diff"
    assert any("LLaDA proposal" in t["label"] for t in vscode.browser("tabs")), vscode.browser("tabs")
    others = [n for n in vscode.notifications() if n is not question and n["message"] != question["message"]]
    assert not any("rewriting" in n["message"] or n["progress"] for n in others), (
        f"the progress is still up: {others!r}"
    )
    edits = [p["edit"] for p in trace_messages(vscode.trace(), "workspace/applyEdit") if "edit" in p]
    assert edits, "the server's proposal is in the trace"
    return {"edit": edits[-1], "uri": uri}


def test_rewrite_selection_shows_the_diff_and_apply_changes_the_file(vscode, screenshots):
    name = "rewrite.py"
    proposal = rewrite_line(vscode, name, 6)
    vscode.wait(lambda: vscode.browser("texts", selector=".notification-fade-in-done"), "the question to be drawn")
    vscode.browser("screenshot", path=str(screenshots / "vscode-rewrite-diff.png"))
    expected = apply_edits(FILES[name], proposal["edit"], proposal["uri"])
    assert expected != FILES[name], "the model proposed no change: the test needs another selection"
    vscode.browser("clickButton", label="Apply")
    vscode.wait(lambda: not vscode.browser("diffShown"), "the diff to close")
    assert vscode.saved(name) == expected


def test_rewrite_selection_discard_leaves_the_file(vscode):
    name = "rewrite2.py"
    rewrite_line(vscode, name, 6)
    vscode.browser("clickButton", label="Discard")
    vscode.wait(lambda: not vscode.browser("diffShown"), "the diff to close")
    tab = next(t for t in vscode.browser("tabs") if t["active"])
    assert name in tab["label"] and not tab["dirty"], tab
    assert (vscode.workspace / name).read_text() == FILES[name]


def test_a_next_edit_shows_and_tab_tab_accepts_it(vscode):
    """After a rename, the scripted model suggests the other uses: struck through with the new name after
    them and a hint on the cursor's line; Tab jumps, Tab accepts."""
    name = "rename.py"
    # The rename's own completion (ghost text) would take the first Tab: completions are off here.
    vscode.write_settings(**{"editor.inlineSuggest.enabled": False})
    try:
        vscode.open(name)
        vscode.press("Control+G")
        vscode.type("2")
        vscode.press("Enter", "Home", "Control+Shift+ArrowRight")
        vscode.type("acc")
        decorations = vscode.wait(
            lambda: (d := vscode.browser("decorations")) and any("next edit" in x["after"] for x in d) and d,
            "a next edit to be shown",
            detail=lambda: vscode.browser("decorations"),
        )
        assert [x["text"] for x in decorations if x["struck"]] == ["count", "count"], decorations
        assert [x["after"] for x in decorations if x["after"] and "next edit" not in x["after"]] == ["acc", "acc"]
        vscode.press("Tab")
        vscode.wait(lambda: vscode.browser("cursor").startswith("Ln 4, Col 9"), "the jump to the suggestion")
        vscode.press("Tab")
        vscode.wait(lambda: not any(x["struck"] for x in vscode.browser("decorations")), "the suggestion to be applied")
        assert vscode.saved(name) == FILES[name].replace("count", "acc")
    finally:
        vscode.write_settings(**{"editor.inlineSuggest.enabled": True})


def test_a_server_that_exits_at_once_is_shown(vscode, tmp_path):
    """The server crashing is shown, not hidden: the status item turns to an error and a notification says so."""
    crashing = tmp_path / "crashing-server"
    crashing.write_text("#!/bin/sh\necho 'llada-lsp: broken on purpose' >&2\nexit 3\n")
    crashing.chmod(0o755)
    vscode.write_settings(**{"llada.server.path": str(crashing)})
    status = vscode.wait(
        lambda: "error" in (s := vscode.status()) and s, "the status item to show the error", detail=vscode.status
    )
    assert "LLaDA" in status
    # The newest in the notification center (toasts may be queued behind the client's own messages).
    vscode.wait(
        lambda: (c := vscode.browser("notificationCenter")) and c[0].startswith("LLaDA: llada-lsp"),
        "the extension's notification of the failure",
        detail=lambda: vscode.browser("notificationCenter"),
    )
