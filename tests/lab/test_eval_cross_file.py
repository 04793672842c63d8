"""The cross-file task cutter (pure: imports, names, holes) and `llada-lab eval-infill --cross-file`
through the real servers on a small package written to a corpus folder."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llada_lab.training.corpus import SourceFile
from llada_lab.training.cross_file import (
    group_by_package,
    imported_modules,
    make_cross_file_tasks,
    module_name,
    modules_of,
)

MODELS = SourceFile(
    "pypi/shop/src/shop/models.py",
    "class Basket:\n    def __init__(self, owner):\n        self.owner = owner\n        self.items = []\n\n"
    "    def add_article(self, article, quantity=1):\n        self.items.append((article, quantity))\n\n\n"
    "def total_price(basket, price_list):\n    return sum(price_list[a] * q for a, q in basket.items)\n",
)
PRICES = SourceFile("pypi/shop/src/shop/util/prices.py", "DEFAULT_PRICES = {'apple': 3}\n")
CURRENT = SourceFile(
    "pypi/shop/src/shop/checkout.py",
    "from . import models\nfrom .util import prices\n\n\ndef checkout(owner, articles):\n"
    "    basket = models.Basket(owner)\n    for article in articles:\n        basket.add_article(article)\n"
    "    return models.total_price(basket, prices.DEFAULT_PRICES)\n",
)
PACKAGE = [MODELS, PRICES, CURRENT]


def test_module_names_follow_the_sdist_layout():
    assert module_name("pypi/shop/src/shop/models.py") == "shop.models"
    assert module_name("pypi/shop/shop/__init__.py") == "shop"
    assert module_name("pypi/shop/tests/test-x.py") is None


def test_relative_imports_resolve_to_the_package_modules():
    found = imported_modules(CURRENT, modules_of(PACKAGE))
    assert [f.path for f in found] == [MODELS.path, PRICES.path]


def test_holes_use_a_name_only_the_imported_module_defines():
    tasks = make_cross_file_tasks([CURRENT], group_by_package(PACKAGE), 10, seed=3)
    assert {t.kind for t in tasks} == {"rest_of_line", "whole_line"}
    for t in tasks:
        assert t.prefix + t.middle + t.suffix == CURRENT.text
        assert t.name in t.middle.split("\n")[0], "the right answer's first line uses the name"
        assert t.name not in t.prefix and t.name not in t.suffix, "the file alone cannot tell the name"
        assert t.opened and all(t.name in dict((f.path, f.text) for f in PACKAGE)[p] for p in t.opened)
    names = {t.name for t in tasks}
    assert "add_article" in names and "total_price" in names and "Basket" in names
    assert "owner" not in names and "basket" not in names, "names the file mentions elsewhere are not cross-file"
    again = make_cross_file_tasks([CURRENT], group_by_package(PACKAGE), 10, seed=3)
    assert again == tasks, "the same seed cuts the same tasks"


def test_names_in_strings_and_comments_are_not_holes():
    text = 'from . import models\n\n\ndef f():\n    """Calls total_price."""\n    return 1  # add_article\n'
    current = SourceFile("pypi/shop/src/shop/doc.py", text)
    assert make_cross_file_tasks([current], group_by_package([MODELS, current]), 10, seed=1) == []


def write_corpus(folder: Path) -> None:
    for name, files in (("heldout-thirdparty", [CURRENT]), ("train", [MODELS, PRICES])):
        with gzip.open(folder / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            for sf in files:
                f.write(json.dumps({"path": sf.path, "text": sf.text}) + "\n")


def test_coverage_runs_the_servers_chooser_without_a_model(tmp_path: Path):
    """`--coverage`: per kind, how often the answer's name is in the chosen snippets and in the
    prompt's share of them (columns: n, chosen, in their lines, in the prompt's)."""
    write_corpus(tmp_path)
    rows = {}
    for share in (25, 1):
        done = subprocess.run([sys.executable, "-m", "llada_lab", "eval-infill", "--cross-file", "--coverage",
                               "--corpus", str(tmp_path), "--n", "2", "--context-share", str(share)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        rows[share] = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[2:]}
    assert rows[25]["all"] == ["4", "4", "4", "4"], "the imported module's definitions hold every name here"
    assert rows[1]["all"] == ["4", "0", "0", "0"], "a share too small for any snippet: none chosen"


@pytest.mark.parametrize("service", [False, True], ids=["in-process", "engine-service"])
def test_the_command_runs_the_real_servers(tmp_path: Path, service: bool):
    """On and off with the embedded model over stdio: every task answered by both, the table and the
    sign-test lines printed, the markdown written; with engine services, their prefix-cache hit rates."""
    write_corpus(tmp_path)
    md = tmp_path / "out.md"
    done = subprocess.run([sys.executable, "-m", "llada_lab", "eval-infill", "--cross-file", "--corpus", str(tmp_path),
                           "--n", "2", "--single-file-n", "1", "--markdown", str(md)] + ["--engine-service"] * service,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {tuple(line.split()[:3]) for line in done.stdout.splitlines()}
    assert ("cross-file", "all", "4") in rows and ("single-file", "all", "2") in rows
    assert re.search(r"cross-file: context on right where off is wrong on \d+ tasks", done.stdout)
    assert re.search(
        r"cross-file: the answer's first line uses the name with context on \d+ times, off \d+", done.stdout
    )
    assert "contextFiles on vs off" in md.read_text()
    chosen = re.search(r"cross-file, context on: snippets chosen for (\d+) of 4 tasks; .* for (\d+)", done.stdout)
    assert chosen and int(chosen[1]) == 4 and int(chosen[2]) == 4, (
        "the server put the open module's names in every prompt"
    )
    rates = re.search(r"Prefix-cache hit rate \(.*\): on (\S+), off (\S+)", done.stdout)
    assert (rates is not None) == service, done.stdout[-600:]
    if service:
        assert all(re.fullmatch(r"\d+\.\d%", rate) for rate in rates.groups()), "both services answered their rate"


def test_training_samples_start_with_the_imported_modules_as_the_server_renders_them():
    """The fine-tune's sequences: the server's prompt (snippets of the imported modules, rendered by
    completion/snippets.py, before <|fim_prefix|>), then the hole's middle, then end-of-text to the end."""
    from transformers import AutoTokenizer

    from llada_lab.training.cross_file import CrossFileSamples
    from llada_lsp.completion.codec import TextCodec
    from llada_lsp.completion.snippets import Snippet, render_snippets
    from llada_lsp.model import EMBEDDED_MODEL

    codec = TextCodec.from_tokenizer(AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL), local_files_only=True))
    special = codec.special
    samples = CrossFileSamples(group_by_package(PACKAGE), codec, 512, seed=5, shares=(50,), cross_share=1.0)
    assert [f.path for f, *_ in samples.files] == [CURRENT.path]
    seen_names = set()
    for _ in range(12):
        ids = samples.sample()
        assert len(ids) == 512 and ids[-1] == special.eos
        head = codec.decode(ids[: ids.index(special.fim_prefix)])
        assert head.startswith("# path: src/shop/"), head[:80]
        parts = [p.split("\n", 1) for p in head.split("# path: ")[1:]]
        assert {path for path, _ in parts} <= {"src/shop/models.py", "src/shop/util/prices.py"}
        assert render_snippets([Snippet(path, text) for path, text in parts]) == head, "the server's rendering"
        middle = codec.decode(ids[ids.index(special.fim_middle) + 1 :]).split("<|endoftext|>")[0]
        seen_names |= {n for n in ("Basket", "add_article", "total_price", "DEFAULT_PRICES") if n in middle}
    assert seen_names, "cross-file holes: their middles use the imported modules' names"
