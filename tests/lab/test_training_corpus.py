"""The v2 corpus and run: sdists recorded in a manifest with their licence and sha256, a rebuild that
verifies both, resumes and fails clearly offline, the split by file, and the candidate run end to end
(train a few steps, resume, score beside the shipped model, decide) on a tiny corpus. No network."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from conftest import TINY_NETWORK

from llada_lab.commands.corpus import corpus_main
from llada_lab.training import corpus
from llada_lab.training.corpus import CorpusError, is_held_out

MIT_TEXT = (
    "Copyright (c) 2020 Someone\n\nPermission is hereby granted, free of charge, to any person obtaining a copy\n"
)
GPL_TEXT = "GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n"
MODULE = '''"""A small module."""


def area(width, height):
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height


class Box:
    def __init__(self, width, height):
        self.width = width
        self.height = height

    def area(self):
        return area(self.width, self.height)
'''


def make_sdist(folder: Path, name: str, version: str, meta: str, licence: str | None, files: dict[str, str]) -> Path:
    """A reproducible .tar.gz laid out as pip downloads one (NAME-VERSION/ at the top)."""
    folder.mkdir(parents=True, exist_ok=True)
    top = f"{name}-{version}"
    path = folder / f"{top}.tar.gz"
    entries = {"PKG-INFO": f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{meta}\n", **files}
    if licence is not None:
        entries["LICENSE"] = licence
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel, text in sorted(entries.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    return path


def held_out_names(prefix: str, count: int, held: bool) -> list[str]:
    names = (f"mod{i}.py" for i in range(10_000))
    return [n for n in names if is_held_out(prefix + n) == held][:count]


def package_files() -> dict[str, str]:
    files = {f"src/shapes/{n}": MODULE for n in held_out_names("pypi/shapes/src/shapes/", 2, True)}
    trained = held_out_names("pypi/shapes/src/shapes/", 4, False)
    files.update({f"src/shapes/{n}": MODULE.replace("Box", "Rect") for n in trained})
    files["src/shapes/_vendor/other.py"] = MODULE  # vendored: its own licence, left out
    files["src/shapes/gpl_helper.py"] = "# This file is under the GNU General Public License v3.\n" + MODULE
    return files


@pytest.fixture
def fake_stdlib(tmp_path) -> Path:
    root = tmp_path / "stdlib"
    root.mkdir()
    for n in held_out_names("", 2, True) + held_out_names("", 4, False):
        (root / n).write_text(MODULE)
    return root


class Index:
    """Stands in for PyPI: serves the sdists in one folder, counting downloads."""

    def __init__(self, folder: Path):
        self.folder, self.calls = folder, []

    def __call__(self, name: str, version: str, dest: Path) -> Path:
        self.calls.append(f"{name}=={version}")
        src = self.folder / f"{name}-{version}.tar.gz"
        if not src.is_file():
            raise CorpusError(f"pip could not download {name}=={version} (no such version)")
        dest.joinpath(src.name).write_bytes(src.read_bytes())
        return dest / src.name


def offline(name: str, version: str, dest: Path) -> Path:
    raise CorpusError(f"pip could not download {name}=={version} (network unreachable)")


def test_licence_comes_from_the_metadata_and_must_agree_with_the_licence_file(tmp_path):
    files = {"pkg/a.py": MODULE}
    pkg, kept, _ = corpus.read_sdist(
        make_sdist(tmp_path / "a", "a", "1", "License-Expression: MIT", MIT_TEXT, files), "a"
    )
    assert (pkg.license, pkg.license_family, pkg.license_file, pkg.files) == ("MIT", "MIT", "LICENSE", 1)
    assert kept[0].path == "pypi/a/pkg/a.py" and pkg.bytes == len(MODULE.encode())
    bsd = "Redistribution and use in source and binary forms, with or without modification, are permitted\n"
    dual = make_sdist(tmp_path / "b", "b", "1", "License-Expression: Apache-2.0 OR BSD-2-Clause", bsd, files)
    assert corpus.read_sdist(dual, "b")[0].license_family == "BSD"
    classifier = make_sdist(
        tmp_path / "c", "c", "1", "Classifier: License :: OSI Approved :: MIT License", MIT_TEXT, files
    )
    assert corpus.read_sdist(classifier, "c")[0].license_family == "MIT"
    refused = {
        "copyleft": make_sdist(tmp_path / "d", "d", "1", "License-Expression: GPL-3.0-only", GPL_TEXT, files),
        "no licence file": make_sdist(tmp_path / "e", "e", "1", "License-Expression: MIT", None, files),
        "file disagrees": make_sdist(tmp_path / "f", "f", "1", "License-Expression: MIT", GPL_TEXT, files),
        "MIT AND GPL": make_sdist(
            tmp_path / "g", "g", "1", "License-Expression: MIT AND GPL-2.0-only", MIT_TEXT, files
        ),
    }
    for why, sdist in refused.items():
        with pytest.raises(CorpusError, match="refused"):
            corpus.read_sdist(sdist, "x")
            pytest.fail(why)


def test_add_records_the_sdist_and_build_writes_the_splits(tmp_path, fake_stdlib):
    index = Index(tmp_path / "index")
    make_sdist(index.folder, "shapes", "1.0", "License-Expression: MIT", MIT_TEXT, package_files())
    manifest, cache = tmp_path / "manifest.json", tmp_path / "cache"
    corpus.add(["shapes==1.0"], cache, manifest, download=index, log=lambda _: None)
    (entry,) = json.loads(manifest.read_text())["packages"]
    assert entry["name"] == "shapes" and entry["license_family"] == "MIT" and entry["files"] == 6
    assert entry["sha256"] == corpus.sha256_of(index.folder / "shapes-1.0.tar.gz")

    paths = corpus.build(cache, manifest, download=index, stdlib=fake_stdlib, log=lambda _: None)
    assert index.calls == ["shapes==1.0"]  # recorded by add, then found in the cache: no second download
    train, stdlib_held, third_held = (corpus.load(paths[s]) for s in ("train", "heldout", "heldout-thirdparty"))
    assert len(third_held) == 2 and all(f.path.startswith("pypi/shapes/") and is_held_out(f.path) for f in third_held)
    assert len(stdlib_held) == 2 and all(is_held_out(f.path) for f in stdlib_held)
    assert len(train) == 4 + 4 and not any(is_held_out(f.path) for f in train)
    assert not any("_vendor" in f.path or "gpl" in f.path for f in train + third_held)


def test_build_verifies_the_sha256_resumes_and_says_what_to_do_offline(tmp_path, fake_stdlib, capsys):
    index = Index(tmp_path / "index")
    make_sdist(index.folder, "shapes", "1.0", "License-Expression: MIT", MIT_TEXT, package_files())
    manifest = tmp_path / "manifest.json"
    corpus.add(["shapes==1.0"], tmp_path / "scratch", manifest, download=index, log=lambda _: None)
    cache = tmp_path / "cache"

    argv = ["--cache", str(cache), "--manifest", str(manifest), "--stdlib", str(fake_stdlib)]
    assert corpus_main([*argv, "--offline"]) == 1
    assert "shapes-1.0.tar.gz is not in" in capsys.readouterr().err
    with pytest.raises(CorpusError, match=r"offline\? put shapes-1.0.tar.gz \(sha256 [0-9a-f]{64}\) in"):
        corpus.build(cache, manifest, download=offline, stdlib=fake_stdlib, log=lambda _: None)

    index.calls.clear()
    corpus.build(cache, manifest, download=index, stdlib=fake_stdlib, log=lambda _: None)
    corpus.build(cache, manifest, download=index, stdlib=fake_stdlib, log=lambda _: None)
    assert index.calls == ["shapes==1.0"]  # the second build is served from the cache

    (cache / "sdists" / "shapes-1.0.tar.gz").write_bytes(b"truncated")  # a damaged cache is fetched again
    corpus.build(cache, manifest, download=index, stdlib=fake_stdlib, log=lambda _: None)
    assert len(index.calls) == 2

    make_sdist(
        index.folder, "shapes", "1.0", "License-Expression: MIT", MIT_TEXT, {"src/x.py": "x = 2\n"}
    )  # re-released
    (cache / "sdists" / "shapes-1.0.tar.gz").unlink()
    with pytest.raises(CorpusError, match="sha256 .* refused"):
        corpus.build(cache, manifest, download=index, stdlib=fake_stdlib, log=lambda _: None)
    assert not (cache / "sdists" / "shapes-1.0.tar.gz").exists()  # an unverified sdist never enters the cache


def test_the_shipped_manifest_pins_permissive_sdists():
    packages = corpus.load_manifest()
    assert len(packages) >= 15
    names = [p.name.lower() for p in packages]
    assert len(set(names)) == len(names)
    for p in packages:
        assert p.license_family in corpus.LICENCES, p
        assert re.fullmatch(r"[0-9a-f]{64}", p.sha256) and p.files > 0 and p.bytes > 0, p
        assert p.sdist.startswith(p.name.replace("-", "_")) or p.sdist.lower().startswith(p.name.lower()), p


@pytest.mark.slow
def test_the_candidate_run_trains_resumes_scores_and_decides(tmp_path, fake_stdlib, restore_threads, capsys):
    """The GPU entry point on the CPU: a tiny network, a tiny corpus, a few steps, then the comparison."""
    import torch

    from llada_lab.commands import candidate

    index = Index(tmp_path / "index")
    make_sdist(index.folder, "shapes", "1.0", "License-Expression: MIT", MIT_TEXT, package_files())
    manifest, cache, out = tmp_path / "manifest.json", tmp_path / "corpus", tmp_path / "run"
    corpus.add(["shapes==1.0"], cache, manifest, download=index, log=lambda _: None)
    corpus.build(cache, manifest, download=None, stdlib=fake_stdlib, log=lambda _: None)
    tiny = TINY_NETWORK
    common = ["--out", str(out), "--corpus", str(cache), "--device", "cpu", "--minutes", "30"]
    train_flags = ["--recipe", "scratch", "--config", json.dumps(tiny), "--batch", "2", "--seq-len", "64",
                   "--threads", "1", "--warmup", "1"]  # fmt: skip

    assert candidate.candidate_main([*common, "--phase", "train", *train_flags, "--steps", "3"]) == 0
    assert torch.load(out / "state.pt", weights_only=False)["step"] == 3
    assert (out / "export" / "model.safetensors").is_file()
    assert candidate.candidate_main([*common, "--phase", "train", *train_flags, "--steps", "5"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert torch.load(out / "state.pt", weights_only=False)["step"] == 5

    evaluate = [
        "--phase",
        "eval",
        "--n",
        "1",
        "--n-other",
        "0",
        "--modes",
        "speed",
        "--jobs",
        "1",
        "--eval-device",
        "cpu",
    ]
    assert candidate.candidate_main([*common, *evaluate]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["pairs"]) == {"stdlib", "thirdparty"} and summary["pooled"]["tasks"] == 2
    pooled = summary["pooled"]
    assert summary["ships"] is (pooled["only_v2"] > pooled["only_v1"] and pooled["p"] < 0.05)
    assert not summary["ships"]  # 2 tasks can never reach p < 0.05 (2 / 2**2 = 0.5)
    assert "| stdlib | rest_of_line | speed |" in printed and "| thirdparty | rest_of_line | speed |" in printed
    assert "v2 ships: no - not significantly better" in printed


def test_the_candidate_run_says_how_to_build_a_missing_corpus(tmp_path, capsys):
    from llada_lab.commands import candidate

    assert candidate.candidate_main(["--out", str(tmp_path / "run"), "--corpus", str(tmp_path / "none")]) == 2
    assert "llada-lab corpus --cache" in capsys.readouterr().err


@pytest.mark.slow  # loads torch in a subprocess
def test_the_gpu_script_runs_the_candidate_command(tmp_path):
    """llada_lab/scripts/train_gpu.sh runs `python3 -m MODULE SUBCOMMAND`: that command exists and runs."""
    import subprocess
    import sys

    script = (Path(__file__).resolve().parents[2] / "llada_lab" / "scripts" / "train_gpu.sh").read_text()
    module, command = re.search(r"python3 -m ([\w.]+) ([\w-]+)", script).groups()
    assert (module, command) == ("llada_lab", "candidate")
    argv = [sys.executable, "-m", module, command, "--out", str(tmp_path / "run"), "--corpus", str(tmp_path / "none")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "llada-lab candidate: error:" in p.stderr and "lacks train.jsonl.gz" in p.stderr
