"""`generate` and `bench` at a terminal and in a script: progress on stderr at a terminal only (they sat
silent for 15-45 s), and `generate`'s threads by default as the server's."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

pytestmark = pytest.mark.slow  # each loads a model in a new process

GENERATE = ["generate", "--prompt", "def mean(values):", "--gen-length", "32"]
BENCH = ["bench", "--prompt-lengths", "64", "--gen-length", "32", "--threads", "1"]


def at_a_terminal(*args: str) -> tuple[int, str]:
    """Runs `llada-lsp ARGS` with stderr on a terminal of 100 columns (stdout to nothing) -> (exit code,
    what the terminal showed, carriage returns as line ends)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 wide
    p = subprocess.Popen([sys.executable, "-m", "llada_lsp", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=terminal)  # fmt: skip
    os.close(terminal)
    shown = b""
    try:
        while chunk := _read(controller):
            shown += chunk
        code = p.wait(timeout=120)
    finally:
        p.kill()
        os.close(controller)
    return code, shown.decode(errors="replace").replace("\r", "\n")


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # the other end closed (Linux says EIO)
        return b""


def in_a_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llada_lsp", *args], capture_output=True, text=True, timeout=120)


def test_generate_shows_its_progress_at_a_terminal_only():
    code, shown = at_a_terminal(*GENERATE)
    assert code == 0, shown
    assert "loading the embedded model" in shown and "decoding:" in shown and "/32 [" in shown, shown
    done = in_a_script(*GENERATE)
    assert done.returncode == 0, done.stderr
    assert "decoding" not in done.stderr and "loading" not in done.stderr, done.stderr


def test_generate_runs_on_as_many_threads_as_the_server_by_default():
    """Torch's default, every core, ran 28x slower than one thread on a busy machine (4.4 against 125.4
    tokens/s); the server takes half the cores."""
    from llada_lsp.commands import generate, serve

    assert generate.parser().get_default("threads") == serve.parser().get_default("threads")
    done = in_a_script(*GENERATE, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["threads"] == max(1, (os.cpu_count() or 2) // 2)
    done = in_a_script(*GENERATE, "--threads", "1")
    summary = [line for line in done.stderr.splitlines() if line.startswith("-- ")]
    assert len(summary) == 1 and summary[0].endswith(" tokens/s, 1 thread"), done.stderr


def test_bench_counts_its_steps_at_a_terminal_only():
    code, shown = at_a_terminal(*BENCH)
    assert code == 0, shown
    for phase in ("warm-up", "cached", "recompute"):
        assert f"prompt 64, {phase}:" in shown, shown
    done = in_a_script(*BENCH)
    assert done.returncode == 0 and "steps" not in done.stderr, done.stderr
    assert "| 64 |" in done.stdout, done.stdout
