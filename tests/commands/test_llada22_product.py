"""LLaDA2.2 through the product: `--edit-ids` on every command that reads a checkpoint, the family and
decoding rule in `plan`, `llada-lsp engine status` and `llada/status`, on a LLaDA2.2-shaped checkpoint
(the embedded model's shapes with LLaDA2.2's keys and tokenizer: conftest.make_llada22_checkpoint).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import LLADA22_EDIT_IDS, make_llada22_checkpoint

from llada_lsp import kernel_backend
from llada_lsp.address import Address
from llada_lsp.backends import native
from llada_lsp.commands import engine, generate, plan, serve
from llada_lsp.completion.generation import ModelSpec, edit_ids_argument
from llada_lsp.runtime.worker import ModelWorker
from llada_lsp.server.completers import LocalCompleter
from llada_lsp.service.client import EngineClient
from llada_lsp.service.listener import Listener
from llada_lsp.service.sessions import EngineService

TINY22 = Path(__file__).resolve().parents[1] / "golden" / "llada22-tiny"


@pytest.fixture(scope="module")
def llada22(tmp_path_factory) -> Path:
    return make_llada22_checkpoint(tmp_path_factory.mktemp("llada22"), edit_boost=3.0)


@pytest.fixture
def short_dir():
    """A socket folder under /tmp: AF_UNIX paths end at ~107 bytes, which pytest's tmp_path can pass."""
    folder = tempfile.mkdtemp(prefix="ll", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


# --- --edit-ids -----------------------------------------------------------------------------------------
def test_edit_ids_are_two_different_ids():
    assert edit_ids_argument("156930,156931") == (156930, 156931)
    assert edit_ids_argument(" 5 , 6") == (5, 6)


@pytest.mark.parametrize(
    "main",
    [plan.plan_main, generate.generate_main, lambda argv: engine.engine_main(argv), serve.parser().parse_args],
    ids=["plan", "generate", "engine", "serve"],
)
@pytest.mark.parametrize("value", ["156930", "a,b", "7,7", "1,2,3", "-1,2"])
def test_a_bad_edit_ids_value_is_refused_in_one_line(main, value, capsys):
    extra = ["--prompt-ids", "1"] if main is generate.generate_main else []
    with pytest.raises(SystemExit) as exit:
        main([*extra, f"--edit-ids={value}"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "argument --edit-ids" in err[-1] and "Traceback" not in "\n".join(err)


def test_plan_takes_the_edit_ids_over_the_config(capsys):
    assert plan.plan_main(["--model", str(TINY22), "--device", "cpu", "--memory", "1TB", "--edit-ids", "7,9"]) == 0
    assert "family: LLaDA2.2: block routing (8 experts per 32-token block), decoding JointThresholdInDel " \
           "(DELETE 7, INSERT 9, override)" in capsys.readouterr().out  # fmt: skip


@pytest.mark.parametrize(("model", "says"), [("llada21", "without expert_capacity"), ("tiny22", "vocabulary")])
def test_plan_refuses_edit_ids_that_cannot_apply_in_one_line(model, says, golden_dir, capsys):
    folder = golden_dir if model == "llada21" else TINY22
    edit_ids = "7,9" if model == "llada21" else "7,4096"
    argv = ["--model", str(folder), "--device", "cpu", "--memory", "1TB", "--edit-ids", edit_ids]
    assert plan.plan_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("llada-lsp plan: ") and says in err and err.count("\n") == 1


def test_generate_refuses_edit_ids_the_checkpoint_cannot_take(golden_dir, capsys):
    argv = ["--model", str(golden_dir), "--device", "cpu", "--prompt-ids", "1,2", "--edit-ids", "7,9"]
    assert generate.generate_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("llada-lsp generate: ") and "expert_capacity" in err and err.count("\n") == 1


def test_generate_decodes_llada22_without_edit_ids(llada22, capsys, one_torch_thread):
    argv = ["--model", str(llada22), "--device", "cpu", "--prompt", "def add(a, b):\n    return", "--json",
            "--gen-length", "32", "--mode", "quality"]  # fmt: skip
    assert generate.generate_main(argv) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert len(report["tokens"]) == 32 and not set(report["tokens"]) & set(LLADA22_EDIT_IDS)


# --- status -------------------------------------------------------------------------------------------
def test_the_native_backend_loads_the_override_and_says_the_family(llada22, one_torch_thread):
    model = native.load(ModelSpec(str(llada22), threads=1, edit_ids=(8000, 8001)), lambda *_: None)
    assert model.edit_ids == (8000, 8001) and model.family.edit_ids_from == "override"
    assert model.family_fields() == {
        "family": "LLaDA2.2", "decoding": "JointThresholdInDel",
        "family_line": "LLaDA2.2: block routing (4 experts per 32-token block), decoding JointThresholdInDel "
                       "(DELETE 8000, INSERT 8001, override)",
        "kernels": kernel_backend.current().line()}  # fmt: skip


async def test_the_language_servers_model_says_its_family_once_loaded(llada22, one_torch_thread):
    completer = LocalCompleter(ModelWorker(asyncio.get_running_loop(), lambda line: None, native.load))
    try:
        ticket = completer.load(ModelSpec(str(llada22), threads=1), lambda *_: None)
        assert "family" not in completer.status()  # loading: no model to speak of yet
        await asyncio.wrap_future(ticket.future)
        status = completer.status()
        assert (status["state"], status["family"], status["decoding"]) == ("ready", "LLaDA2.2", "JointThresholdInDel")
    finally:
        assert completer.worker.stop()


async def test_the_engine_status_says_the_family(llada22, short_dir, capsys, one_torch_thread):
    worker = ModelWorker(asyncio.get_running_loop(), lambda line: None, native.load)
    service = EngineService(worker, ("speed", "quality"), None)
    listener = Listener.claim(Address("unix", str(short_dir / "e.sock")))
    try:
        await listener.bind(service.handle)
        await asyncio.wrap_future(service.load(ModelSpec(str(llada22), threads=1)).future)
        async with await EngineClient.connect(listener.address, "editor") as client:
            status = await client.status()
            assert (status.family, status.decoding) == ("LLaDA2.2", "JointThresholdInDel")
        assert await asyncio.to_thread(engine.engine_main, ["status", "--listen", str(listener.address)]) == 0
    finally:
        listener.close()
        await service.close()
        assert worker.stop()
    out = capsys.readouterr().out
    assert ("family: LLaDA2.2: block routing (4 experts per 32-token block), decoding JointThresholdInDel "
            "(DELETE 8187, INSERT 8191, config)\n") in out and "state: ready" in out  # fmt: skip
