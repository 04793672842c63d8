"""`llada-lab eval-rewrite` on a few held-out selections: its counts add up and it publishes them."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_eval_rewrite_counts_every_selection_and_publishes_its_table(tmp_path, capsys, restore_threads):
    from llada_lab.commands.eval_rewrite import eval_rewrite_main

    out_file = tmp_path / "rewrite.md"
    code = eval_rewrite_main(["--n", "1", "--threads", "1", "--markdown", str(out_file)])
    out = capsys.readouterr().out
    assert code == 0, out  # 1 would mean an applied rewrite left a file unparsable
    all_row = next(line.split() for line in out.splitlines() if line.startswith("all "))
    n, parses, applied, refused, unchanged, too_long, broken = map(int, all_row[1:])
    assert n == 3 and applied + refused + unchanged + too_long == n and broken == 0 and parses <= n
    published = out_file.read_text()
    assert "| selection | n | proposal parses |" in published and "| all | 3 |" in published
    assert "Command: `" in published and "exact-unchanged rate" in published
