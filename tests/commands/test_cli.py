"""The command line as a user runs it: `llada-lsp generate` reproduces the reference, bad input gets
one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llada_lsp", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # loads torch and a model in a subprocess
def test_generate_reproduces_a_reference_case(golden_dir, golden_generate):
    case = next(c for c in golden_generate["cases"] if c["id"] == "A07_P32_G64_quality")
    p = run(
        "generate",
        "--model",
        str(golden_dir),
        "--prompt-ids",
        ",".join(map(str, case["prompt_ids"])),
        "--mode",
        "quality",
        "--gen-length",
        "64",
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["tokens"] == case["output_ids"] and out["steps"] == case["num_forward_calls"]
    assert out["tokens_per_forward"] > 0 and out["tokens_per_second"] > 0


@pytest.mark.slow  # loads torch and a model in a subprocess
def test_bad_input_is_one_line_and_nonzero(golden_dir, tmp_path):
    p = run("generate", "--model", str(tmp_path / "nope"), "--prompt-ids", "1,2")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no such model folder" in p.stderr
    p = run("generate", "--model", str(golden_dir), "--prompt", "text")
    assert p.returncode == 2 and "no tokenizer" in p.stderr
    p = run("generate", "--model", str(golden_dir), "--prompt-ids", ",".join(["1"] * 600))
    assert p.returncode == 2 and "max_position_embeddings" in p.stderr


def test_help_lists_the_subcommands():
    p = run("--help")
    assert p.returncode == 0
    for name in ("serve", "engine", "generate", "bench", "complete", "rewrite", "plan"):
        assert name in p.stdout


@pytest.mark.slow  # loads torch and a model in a subprocess
def test_a_session_read_from_a_file(tmp_path):
    """stdin that is not a pipe (a recorded session replayed from a file) goes through pygls' own
    reader: answered, and shutdown + exit end with code 0."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    session = tmp_path / "session.lsp"
    session.write_bytes(
        b"".join(
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body) for body in (json.dumps(m).encode() for m in messages)
        )
    )
    with session.open("rb") as stdin:
        p = subprocess.run([sys.executable, "-m", "llada_lsp"], stdin=stdin, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    assert b'"inlineCompletionProvider"' in p.stdout and b'"id": 2' in p.stdout


@pytest.mark.parametrize("args", [("plan", "--sglang"), ("--help",), ("plan", "--help")])
def test_a_closed_stdout_ends_quietly(args):
    """`plan --sglang | head`: the reader is gone before the command writes (its read end is closed
    before the child can print), so every write meets a closed pipe. The command ends as SIGPIPE ends a
    C program, 141, with nothing on stderr (it was a BrokenPipeError traceback). argparse's own --help
    swallows the error and says 0: quiet is what counts."""
    import os

    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "llada_lsp", *args], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)
    _, stderr = proc.communicate(timeout=120)
    assert stderr.decode() == ""
    assert proc.returncode == (0 if args == ("plan", "--help") else 141)
