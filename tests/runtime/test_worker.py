"""The model thread without a model: queueing, supersede per key, cancel between steps, drafts and
errors delivered on the loop. Jobs here are plain callables that 'step' like the engine does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from llada_lsp.completion.generation import ModelSpec
from llada_lsp.model import CheckpointError
from llada_lsp.runtime.worker import ModelUnavailable, ModelWorker


def stepping(steps: int, gate: threading.Event | None = None, started: threading.Event | None = None):
    """A job that runs `steps` steps, checking the cancel flag before each, as the engine does."""

    def job(model, ticket):
        if started is not None:
            started.set()
        done = 0
        for step in range(1, steps + 1):
            if ticket.is_set():
                break
            if gate is not None:
                gate.wait(5)
            done = step
            ticket.emit(step, f"text {step}")
        return (model, done)

    return job


async def ready_worker(logs: list[str]) -> ModelWorker:
    loop = asyncio.get_running_loop()
    worker = ModelWorker(
        loop, logs.append, loader=lambda spec, report, cancelled: report("reading", 50) or f"model {spec.name}"
    )
    reports = []
    await asyncio.wrap_future(worker.load(ModelSpec("m"), lambda msg, pct: reports.append((msg, pct))).future)
    assert worker.state == "ready" and reports == [("reading", 50)]
    return worker


async def test_jobs_run_in_order_with_drafts_on_the_loop():
    logs: list[str] = []
    worker = await ready_worker(logs)
    loop_thread = threading.get_ident()
    drafts = []
    ticket = worker.submit(
        "a", "job a", stepping(3), lambda step, text: drafts.append((step, text, threading.get_ident()))
    )
    assert await asyncio.wrap_future(ticket.future) == ("model m", 3)
    await asyncio.sleep(0)  # drafts were scheduled before the result: let the loop run them
    assert [(s, t) for s, t, _ in drafts] == [(1, "text 1"), (2, "text 2"), (3, "text 3")]
    assert {thread for *_, thread in drafts} == {loop_thread}
    assert worker.stop()


async def test_a_new_job_supersedes_the_running_one_with_the_same_key():
    logs: list[str] = []
    worker = await ready_worker(logs)
    gate, started = threading.Event(), threading.Event()
    first = worker.submit("doc", "first", stepping(1000, gate, started))
    await asyncio.to_thread(started.wait, 5)  # the first job is running
    other = worker.submit("other", "other", stepping(2))
    assert not first.future.done() and not first.is_set(), "another key leaves it running"
    second = worker.submit("doc", "second", stepping(2))
    assert first.future.cancelled() and first.is_set()
    gate.set()
    assert await asyncio.wrap_future(second.future) == ("model m", 2)
    assert await asyncio.wrap_future(other.future) == ("model m", 2)
    assert worker.stop()
    await asyncio.sleep(0)  # the log lines were scheduled on the loop before the thread ended
    first_log = next(line for line in logs if line.startswith("first"))
    assert "cancelled" in first_log and ("(0 steps after" in first_log or "(1 steps after" in first_log)


async def test_a_superseded_job_that_has_not_started_never_runs():
    worker = await ready_worker([])
    gate, started = threading.Event(), threading.Event()
    busy = worker.submit("other", "busy", stepping(1, gate, started))
    await asyncio.to_thread(started.wait, 5)  # the model thread is busy: what follows is queued
    ran = []

    def job(model, ticket):
        ran.append(ticket.label)
        return ticket.label

    queued = worker.submit("doc", "queued", job)
    latest = worker.submit("doc", "latest", job)
    assert queued.future.cancelled() and not latest.future.done()
    gate.set()
    assert await asyncio.wrap_future(latest.future) == "latest"
    assert await asyncio.wrap_future(busy.future) == ("model m", 1)
    assert ran == ["latest"]
    assert worker.stop()


async def test_a_draft_is_dropped_when_the_cancel_arrives_before_it_is_delivered():
    """The draft was handed to the loop, then the request was cancelled: the editor never sees it."""
    worker = await ready_worker([])
    emitted = threading.Event()
    drafts = []

    def job(model, ticket):
        ticket.emit(1, "stale")
        ticket.cancel()  # as the loop would, between the hand-over and the delivery
        emitted.set()
        return None

    ticket = worker.submit("doc", "job", job, lambda step, text: drafts.append(text))
    assert emitted.wait(5)  # blocks the loop: the draft cannot be delivered before the cancel
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wrap_future(ticket.future)
    assert worker.stop()
    await asyncio.sleep(0)
    assert drafts == []


async def test_cancel_stops_within_one_step():
    logs: list[str] = []
    worker = await ready_worker(logs)
    gate = threading.Event()
    ticket = worker.submit("doc", "slow", stepping(1000, gate))
    ticket.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wrap_future(ticket.future)
    assert worker.stop()
    assert ticket.steps <= 1


async def test_the_log_counts_the_step_that_ran_after_the_cancel():
    """The cancel arrives during a step: that step completes (one step after the cancel), then the
    job sees the flag and stops."""
    logs: list[str] = []
    worker = await ready_worker(logs)
    gate, started = threading.Event(), threading.Event()

    def job(model, ticket):
        ticket.emit(1)
        started.set()
        gate.wait(5)  # step 2 is running when the cancel arrives
        ticket.emit(2)
        assert ticket.is_set()
        return None

    ticket = worker.submit("doc", "slow", job)
    await asyncio.to_thread(started.wait, 5)
    ticket.cancel()
    gate.set()
    assert worker.stop()
    for _ in range(2):  # the log line is queued on the loop, behind the answer: two turns
        await asyncio.sleep(0)
    (line,) = [line for line in logs if line.startswith("slow")]
    assert line.startswith("slow: 2 steps in ") and line.endswith(", cancelled (1 steps after the cancel)"), line


async def test_a_failed_load_is_reported_and_jobs_answer_with_it():
    def broken(spec, report, cancelled):
        raise CheckpointError(f"{spec.name}: no such model folder")

    worker = ModelWorker(asyncio.get_running_loop(), lambda line: None, loader=broken)
    load = worker.load(ModelSpec("/nowhere"), lambda *_: None)
    with pytest.raises(ModelUnavailable, match="/nowhere"):
        await asyncio.wrap_future(load.future)
    assert worker.state == "error" and "/nowhere" in worker.error
    with pytest.raises(ModelUnavailable, match="/nowhere"):
        await asyncio.wrap_future(worker.submit("doc", "job", stepping(2)).future)
    assert worker.stop()


async def test_a_job_that_raises_answers_its_request_and_the_thread_goes_on():
    worker = await ready_worker([])

    def boom(model, ticket):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await asyncio.wrap_future(worker.submit("doc", "boom", boom).future)
    assert await asyncio.wrap_future(worker.submit("doc", "next", stepping(1)).future) == ("model m", 1)
    assert worker.stop()


async def test_a_plan_without_a_group_runs(one_torch_thread):
    """The in-process front submits plans with no group (no connection): they take their turn as any
    other (a None group once read as "no group may start" and the request waited forever)."""
    from llada_lsp.backends import native
    from llada_lsp.completion.jobs import Infill
    from llada_lsp.completion.pipeline import make_plan

    worker = native.start(asyncio.get_running_loop(), lambda line: None)
    await asyncio.wrap_future(worker.load(ModelSpec(None, threads=1), lambda *_: None).future)
    job = Infill.at("def f(x):\n    return ", 21, "speed", 8)
    ticket = worker.submit("doc", "inline", lambda model, t: make_plan(model, job, t))
    outcome = await asyncio.wait_for(asyncio.wrap_future(ticket.future), 60)
    assert outcome.steps >= 1
    assert worker.stop()


async def test_the_model_thread_gives_freed_memory_back_once_idle_after_work(monkeypatch):
    """After a job, and TRIM_AFTER seconds with nothing to do, the freed heap goes back to the system
    (runtime/memory.py): once per idle spell, never while idle without work (the load counts as work)."""
    from llada_lsp.runtime import worker as worker_module

    trims = []
    monkeypatch.setattr(worker_module, "TRIM_AFTER", 0.1)
    monkeypatch.setattr(worker_module, "release_freed_memory", lambda: trims.append(time.monotonic()))
    worker = await ready_worker([])
    await asyncio.sleep(0.4)
    assert len(trims) == 1  # after the load
    await asyncio.sleep(0.3)
    assert len(trims) == 1, "idle without work: nothing more"
    done = time.monotonic()
    await asyncio.wrap_future(worker.submit("a", "job a", stepping(2)).future)
    await asyncio.sleep(0.4)
    assert len(trims) == 2 and trims[1] >= done + 0.1
    assert worker.stop()


TRIM_CHILD = """
from llada_lsp.runtime.memory import release_freed_memory
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
keep, junk = [], []
for i in range(200_000):  # 200 MB in 1 kB pieces, with a survivor every 100 (the heap cannot shrink from its top)
    junk.append(bytes(1000))
    if i % 100 == 0:
        keep.append(bytes(1000))
del junk
freed = rss()
print(release_freed_memory(), round(freed - rss()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_memory_goes_back_to_the_system():
    """What the model thread calls: 200 MB freed in small pieces stay in the process until it runs."""
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], capture_output=True, text=True, check=True).stdout
    trimmed, given_back = out.split()
    assert trimmed == "True" and int(given_back) > 150, out
