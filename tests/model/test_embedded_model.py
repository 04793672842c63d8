"""The shipped model, as a user gets it: loads with no network and infills held-out code (copy.py is
in the held-out split, never trained on) with a non-empty line that parses, through the server's own
infill job (prompt, token healing, decoding, post-processing)."""

from __future__ import annotations

import ast
import threading

import pytest

from llada_lab.training.corpus import is_held_out
from llada_lsp.backends.native import load
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.completion.jobs import Infill
from llada_lsp.completion.pipeline import run_infill


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


# From the standard library's copy.py (held out); <CURSOR> marks the hole: the rest of a line was
# removed ("x)"), the cursor is mid-line, as when typing.
SNIPPET = '''\
def copy(x):
    """Shallow copy operation on arbitrary Python objects."""

    cls = type(<CURSOR>

    copier = _copy_dispatch.get(cls)
    if copier:
        return copier(x)

    if issubclass(cls, type):
        # treat it as a regular class:
        return _copy_immutable(x)

    copier = getattr(cls, "__copy__", None)
    if copier is not None:
        return copier(x)
'''


def test_the_shipped_model_infills_held_out_code_with_a_line_that_parses(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert is_held_out("copy.py")
    model = load(ModelSpec(None), lambda *_: None)
    prefix, suffix = SNIPPET.split("<CURSOR>")
    drafts = []
    out = run_infill(
        model,
        Infill.at(prefix + suffix, len(prefix), "speed", 64, 1024),
        threading.Event(),
        lambda step, text: drafts.append(text),
    )
    assert out.text.split("\n")[0].strip(), out
    ast.parse(prefix + out.text + suffix)
    assert drafts and out.steps >= 1
