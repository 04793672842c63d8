"""`llada-lab eval-next-edit`'s harness: applying an answer, and a whole run against a
stand-in server (tests/fakes/next_edit_server.py) that keeps the document from the replayed history."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from llada_lab.commands import eval_next_edit as ev
from llada_lab.training.edit_pairs import write_jsonl_gz
from llada_lsp.lsp_client import position
from llada_lsp.server.documents import Document
from llada_lsp.server.positions import UTF16

FAKE = Path(__file__).parents[1] / "fakes" / "next_edit_server.py"
TEXT = "# 😀 é\ndef f(a):\n    return a\n"


def test_an_answer_applies_all_its_edits_against_its_version():
    doc = Document("file:///m.py", 3, TEXT)

    def rng(a, b):
        return {"start": position(doc, a, UTF16), "end": position(doc, b, UTF16)}

    i, j = TEXT.index("(a)") + 1, TEXT.index("return a") + 7
    answer = {
        "edits": [{"range": rng(i, i + 1), "newText": "b"}, {"range": rng(j, j + 1), "newText": "b"}],
        "version": 3,
    }
    assert ev.apply_answer(doc, answer, UTF16) == TEXT.replace("(a)", "(b)").replace("return a", "return b")
    assert doc.text == TEXT  # the suggestion is scored, not applied to the document
    assert ev.apply_answer(Document(doc.uri, 4, TEXT), answer, UTF16) is None  # an answer for another version
    assert ev.apply_answer(doc, {"edits": []}, UTF16) is None


BEFORE = "# 😀 é\ndef f(old_name):\n    return old_name + old_name\n"
RENAME = [{"start": BEFORE.index("old_name"), "end": BEFORE.index("old_name") + 8, "text": "new_name"}]
AFTER_RENAME = BEFORE.replace("old_name", "new_name", 1)


def _case(before, history, expected, kind):
    text = before
    for e in history:
        text = text[: e["start"]] + e["text"] + text[e["end"] :]
    last = history[-1]
    return {
        "repo": "o/r",
        "commit": "c" * 40,
        "path": "m.py",
        "licence": "MIT",
        "kind": kind,
        "before": before,
        "history": history,
        "cursor": last["start"] + len(last["text"]),
        "expected": expected,
    }


def test_a_whole_run_against_a_stand_in_server(tmp_path, capsys):
    cases = [
        _case(BEFORE, RENAME, AFTER_RENAME.replace("old_name", "new_name", 1), "below"),  # it renames the next use
        _case("x = 1\n", [{"start": 4, "end": 5, "text": "2"}], None, "no-edit"),  # nothing to rename: silent
        _case(BEFORE, RENAME, None, "no-edit"),  # it suggests where nothing was due
    ]
    path = tmp_path / "cases.jsonl.gz"
    write_jsonl_gz(path, cases)
    server = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
    published = tmp_path / "next_edit.md"
    argv = ["--cases", str(path), "--server", server, "--json", "--configs", "shipped,no-history,always-silent"]
    assert ev.eval_next_edit_main([*argv, "--markdown", str(published)]) == 0
    out = capsys.readouterr().out
    rows = __import__("json").loads(out.strip().splitlines()[-1])
    shipped, no_history, silent = rows["shipped model"], rows["rewrite the window without history"], rows[ev.SILENT]
    assert shipped["exact_edit"] == 1 and shipped["exact_all"] == 2 / 3 and shipped["suggested"] == 2
    assert shipped["silent_precision"] == 1 and shipped["silent_recall"] == 0.5 and shipped["errors"] == 0
    assert shipped["delta_chrf"] == 100 and shipped["reversal_rate"] == 0 and shipped["parse_kept"] == 1
    assert shipped["p50_ms"] > 0
    assert no_history == {**no_history, "suggested": 0, "exact_all": 2 / 3, "exact_edit": 0}
    assert silent["exact_all"] == 2 / 3 and silent["silent_recall"] == 1
    assert re.search(r"^shipped model +66\.7% +100\.0% +100 ", out, re.M)  # the terminal's table, aligned
    pair = "shipped model vs rewrite the window without history: exact only in the first 1, only in the second 1"
    assert pair in out
    markdown = published.read_text()
    assert markdown.startswith("## Next-edit suggestions") and "Commit: `" in markdown and f"- {pair}" in markdown
    assert "| shipped model | 66.7% | 100.0% | 100 |" in markdown


def test_an_earlier_runs_scores_are_tabulated_and_sign_tested_beside_this_runs(tmp_path, capsys):
    cases = [
        _case(BEFORE, RENAME, AFTER_RENAME.replace("old_name", "new_name", 1), "below"),
        _case("x = 1\n", [{"start": 4, "end": 5, "text": "2"}], None, "no-edit"),
    ]
    path, saved = tmp_path / "cases.jsonl.gz", tmp_path / "shipped.json"
    write_jsonl_gz(path, cases)
    server = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
    ev.eval_next_edit_main(["--cases", str(path), "--server", server, "--configs", "shipped", "--save", str(saved)])
    capsys.readouterr()
    first = __import__("json").loads(saved.read_text())["scores"]["shipped"][0]
    second = BEFORE.index("old_name", BEFORE.index("old_name") + 1)
    assert first["change"] == [second, second + 3, "new"]  # old_name -> new_name, the shared "_name" trimmed
    ev.eval_next_edit_main(["--cases", str(path), "--configs", "always-silent", "--load", str(saved)])
    out = capsys.readouterr().out
    assert re.search(r"^shipped model +100\.0% ", out, re.M) and re.search(rf"^{ev.SILENT} +50\.0% ", out, re.M)
    assert f"shipped model vs {ev.SILENT}: exact only in the first 1, only in the second 0" in out
    write_jsonl_gz(path, cases[:1])
    try:
        ev.eval_next_edit_main(["--cases", str(path), "--configs", "always-silent", "--load", str(saved)])
    except SystemExit as exit:
        assert exit.code == 2  # scores of other cases are refused
    else:
        raise AssertionError("--load accepted scores of other cases")
