"""The simulated user of `llada-lab eval-typing` and its scores (pure: no server, no model), and one small
replay through the real servers."""

from __future__ import annotations

import re

import pytest

from llada_lab.training.corpus import SourceFile
from llada_lab.training.eval_typing import Replay, Span, User, make_spans, paired_saved, scores

FILE = SourceFile("pkg/mod.py", "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(12)))


def test_spans_are_whole_lines_typed_on_an_opened_line():
    spans = make_spans([FILE], 200, seed=1)
    assert sum(len(s.text) for s in spans) >= 200
    for s in spans:
        assert s.before + s.text + s.after == FILE.text, "typing the span gives the file back"
        assert s.after.startswith("\n") and not s.text.endswith("\n") and (s.before == "" or s.before.endswith("\n"))


def user(accept: float, text: str = "abc = 1") -> tuple[User, Replay]:
    replay = Replay()
    return User(replay, 0, 0, Span("m.py", "", text, "\n"), accept), replay


def answered(keystroke, text: str, ms: float) -> None:
    keystroke.answer, keystroke.final, keystroke.first_shown, keystroke.steps = text, ms / 1000, ms / 1000, 1


def test_a_matching_suggestion_is_taken_with_tab_or_typed_through():
    u, replay = user(accept=1.0)
    inserted, k = u.act()
    assert (inserted, k.kind) == ("a", "other")
    answered(k, "bc = 1", 50)
    u.see(k, 0.12)
    inserted, k = u.act()
    assert (inserted, k.kind) == ("bc = 1", "tab") and u.done
    assert replay.accepted == 6 and scores(replay)["chars_saved"] == 6 / 7

    u, replay = user(accept=0.0)
    _, k = u.act()
    answered(k, "bc = 1", 50)
    u.see(k, 0.12)
    inserted, k = u.act()
    assert (inserted, k.kind) == ("b", "through") and replay.accepted == 0


def test_late_answers_are_not_shown_and_wrong_ones_are_counted():
    u, replay = user(accept=1.0)
    _, k = u.act()
    answered(k, "bc = 1", 300)  # after the next keystroke
    u.see(k, 0.12)
    assert not k.shown and u.act()[1].kind == "other"
    u, replay = user(accept=1.0)
    _, k = u.act()
    answered(k, "xyz", 50)
    u.see(k, 0.12)
    assert u.act()[1].kind == "other" and replay.wrong_next == 1 and scores(replay)["wrong_next"] == 1.0


def test_characters_saved_are_paired_by_keystroke():
    on, off = Replay(), Replay()
    on.saved = {(0, 0): True, (0, 1): True, (0, 2): False}
    off.saved = {(0, 0): False, (0, 1): True, (0, 2): False}
    only_on, only_off, p = paired_saved(on, off)
    assert (only_on, only_off) == (1, 0) and p == 1.0


@pytest.mark.slow
def test_a_small_replay_through_the_real_servers_prints_and_publishes_its_table(monkeypatch, tmp_path, capsys):
    """One span's first characters typed through both servers (revise on and off), the embedded model."""
    from llada_lab.commands import eval_typing as command

    def one_short_span(files, chars, seed):
        span = make_spans(files, chars, seed)[0]
        return [Span(span.path, span.before, span.text[:6], span.text[6:] + span.after)]

    monkeypatch.setattr(command, "make_spans", one_short_span)
    published = tmp_path / "typing.md"
    argv = ["--chars", "1", "--threads", "1", "--corpus", str(tmp_path), "--markdown", str(published)]
    assert command.eval_typing_main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^keystrokes \(typing through\) +\d+ \(\d+\) +\d+ \(\d+\)$", out, re.M)
    assert "stdlib: typing through, forwards/request on/off = " in out
    markdown = published.read_text()
    assert markdown.startswith("## Suggestions revised while you type") and "Commit: `" in markdown
    assert "|  | stdlib: revise on | stdlib: revise off |" in markdown and "| characters saved |" in markdown
    keystrokes = re.search(r"^\| keystrokes \(typing through\) \| (\d+) \(\d+\) \| (\d+) \(\d+\) \|$", markdown, re.M)
    assert keystrokes and 1 <= int(keystrokes[1]) <= 6 and 1 <= int(keystrokes[2]) <= 6  # Tab saves some
    assert "- stdlib: typing through" in markdown
