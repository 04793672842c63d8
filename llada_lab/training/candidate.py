"""A candidate embedded model beside the shipped one: both score held-out standard-library and
third-party tasks, and the shipping rule says whether the candidate ships.

Knows the evaluation entry points and the shipping rule; nothing of the network's insides. The run that
trains a candidate and then calls `compare` is `llada-lab candidate`. The rule: the
candidate ships only if, in speed mode, it gets the first line right on significantly more held-out
tasks than the shipped model (task by task, the tasks only one of them gets right, two-sided sign test
p < 0.05, standard-library and third-party tasks together), does not get fewer right on the
standard-library tasks alone, and its bf16 weights stay under 25 MB.
"""

from __future__ import annotations

import functools
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

from llada_lsp.backends import native
from llada_lsp.completion.generation import ModelSpec

from . import corpus
from .eval_infill import TASK_KINDS, Task, answer, make_tasks, paired, sign_test

SPLITS = {"stdlib": "heldout", "thirdparty": "heldout-thirdparty"}  # evaluation split -> corpus split
MAX_WEIGHT_BYTES = 25_000_000  # the package's cap on the embedded model's bf16 weights
ALPHA = 0.05


@dataclass(frozen=True)
class Unit:
    """One evaluation job: one model's answers to one split's tasks in one mode."""

    model: str  # "v1" | "v2"
    path: str
    split: str
    tasks_file: str
    mode: str
    n: int
    n_other: int
    seed: int
    device: str
    threads: int


def trained_seconds(out: Path) -> float:
    state = out / "state.pt"
    if not state.is_file():
        return 0.0
    # mmap: only the pickled dict is read, not the weights and optimizer state beside the figure
    return float(torch.load(state, map_location="cpu", weights_only=False, mmap=True).get("seconds", 0.0))


@functools.lru_cache(maxsize=2)
def split_tasks(tasks_file: str, n: int, n_other: int, seed: int) -> tuple[Task, ...]:
    """The split's tasks: `n` rest-of-line tasks (the kind the gate is about: the only one either model
    gets right often) and `n_other` of each other kind, the same for every model and mode."""
    source = corpus.load(Path(tasks_file))
    tasks = make_tasks(n, seed, source, kinds=("rest_of_line",))
    if n_other:
        tasks += make_tasks(n_other, seed, source, kinds=tuple(k for k in TASK_KINDS if k != "rest_of_line"))
    return tuple(tasks)


@functools.lru_cache(maxsize=2)  # the shipped model and the candidate
def _loaded(path: str, device: str, threads: int):
    # On a GPU the engine's default K/V pool is a quarter of the free memory: far too much for the
    # parallel evaluation processes; 256 MB holds many 512-position sequences of these small models.
    cache_mb = 256.0 if device.startswith("cuda") else None
    spec = ModelSpec(path, device=device, dtype="float32", threads=threads, cache_mb=cache_mb)
    return native.load(spec, lambda *_: None)


def evaluate(unit: Unit) -> dict:
    """One unit's answers (in task order) and its scores per kind; runs in a worker process or here."""
    model = _loaded(unit.path, unit.device, unit.threads)
    tasks = split_tasks(unit.tasks_file, unit.n, unit.n_other, unit.seed)
    started, answers, scores = time.time(), [""] * len(tasks), {}
    for kind in dict.fromkeys(t.kind for t in tasks):
        at = [i for i, t in enumerate(tasks) if t.kind == kind]
        completions, scores[kind] = answer(model, [tasks[i] for i in at], unit.mode)
        for i, completion in zip(at, completions):
            answers[i] = completion
    return {"unit": asdict(unit), "answers": answers, "scores": scores, "seconds": time.time() - started}


def compare(
    out: Path,
    corpus_dir: Path,
    baseline: Path,
    modes: list[str],
    device: str,
    jobs: int,
    n: int,
    n_other: int,
    task_seed: int,
) -> dict:
    """The candidate OUT/export and `baseline` on the held-out splits of `corpus_dir` in each of `modes`
    (speed among them: the rule is decided in speed mode) on `device` ("auto": cuda when available), in
    `jobs` processes, over `split_tasks(..., n, n_other, task_seed)`; writes OUT/summary.md and
    OUT/summary.json and returns the summary."""
    candidate = out / "export"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cores = os.cpu_count() or 1
    threads = max(1, cores // max(jobs, 1))
    units = [Unit(name, str(path), split, str(corpus_dir / corpus.SPLIT_FILES[file]), mode, n, n_other,
                  task_seed, device, threads)
             for split, file in SPLITS.items() for mode in modes
             for name, path in (("v1", baseline), ("v2", candidate))]  # fmt: skip
    started = time.time()
    if jobs > 1:  # separate processes: each decodes one request at a time, so they overlap well
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(evaluate, units))
    else:
        results = [evaluate(u) for u in units]
    print(f"evaluation: {len(units)} units in {time.time() - started:.0f}s", flush=True)
    return summarize(out, results, candidate)


def summarize(out: Path, results: list[dict], candidate: Path) -> dict:
    by = {(r["unit"]["model"], r["unit"]["split"], r["unit"]["mode"]): r for r in results}
    header = "| split | task | mode | v1 first-line EM | v2 first-line EM | v1 syntax-valid | v2 syntax-valid | v1 TPF | v2 TPF |"
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    splits = list(dict.fromkeys(r["unit"]["split"] for r in results))
    modes = list(dict.fromkeys(r["unit"]["mode"] for r in results))
    for split in splits:
        for mode in modes:
            one, two = by[("v1", split, mode)]["scores"], by[("v2", split, mode)]["scores"]
            for kind in one:
                a, b = one[kind], two[kind]
                lines.append(
                    f"| {split} | {kind} | {mode} | {a['first_line_em']:.1%} | {b['first_line_em']:.1%} "
                    f"| {a['syntax_ok']:.1%} | {b['syntax_ok']:.1%} | {a['tpf']:.2f} | {b['tpf']:.2f} |"
                )
    pairs = {}
    for split in splits:
        u = by[("v1", split, "speed")]["unit"]
        tasks = list(split_tasks(u["tasks_file"], u["n"], u["n_other"], u["seed"]))
        only_v2, only_v1, p = paired(
            tasks, by[("v2", split, "speed")]["answers"], by[("v1", split, "speed")]["answers"]
        )
        pairs[split] = {"tasks": len(tasks), "only_v2": only_v2, "only_v1": only_v1, "p": p}
    only_v2, only_v1 = (sum(s[k] for s in pairs.values()) for k in ("only_v2", "only_v1"))
    pooled = {
        "tasks": sum(s["tasks"] for s in pairs.values()),
        "only_v2": only_v2,
        "only_v1": only_v1,
        "p": sign_test(only_v2, only_v1),
    }
    weight_bytes = (candidate / "model.safetensors").stat().st_size
    reasons = []
    if not (only_v2 > only_v1 and pooled["p"] < ALPHA):
        reasons.append(
            f"not significantly better on held-out tasks (right only in v2 {only_v2}, only in v1 "
            f"{only_v1}, p = {pooled['p']:.3g})"
        )
    if "stdlib" in pairs and pairs["stdlib"]["only_v2"] < pairs["stdlib"]["only_v1"]:
        reasons.append(
            f"fewer right on the standard library ({pairs['stdlib']['only_v2']} vs {pairs['stdlib']['only_v1']})"
        )
    if weight_bytes > MAX_WEIGHT_BYTES:
        reasons.append(f"weights of {weight_bytes / 1e6:.1f} MB exceed {MAX_WEIGHT_BYTES / 1e6:.0f} MB")
    ships = not reasons
    lines.append("")
    for split, s in pairs.items():
        lines.append(
            f"speed, {split}: first line right only in v2 {s['only_v2']}, only in v1 {s['only_v1']} "
            f"of {s['tasks']} tasks (sign test p = {s['p']:.3g})"
        )
    lines.append(
        f"speed, all held-out: only in v2 {only_v2}, only in v1 {only_v1} of {pooled['tasks']} tasks "
        f"(p = {pooled['p']:.3g})"
    )
    lines.append(f"v2 ships: {'yes' if ships else 'no'}" + ("" if ships else " - " + "; ".join(reasons)))
    if ships:
        lines.append(
            f"to ship: copy {candidate}/{{config.json,model.safetensors,tokenizer.json,tokenizer_config.json}} "
            "into llada_lsp/data/tiny/"
        )
    summary = {"ships": ships, "reasons": reasons, "pairs": pairs, "pooled": pooled, "weight_bytes": weight_bytes,
               "trained_seconds": trained_seconds(out),
               "scores": {f"{m}/{s}/{mode}": r["scores"] for (m, s, mode), r in by.items()}}  # fmt: skip
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines), flush=True)
    return summary
