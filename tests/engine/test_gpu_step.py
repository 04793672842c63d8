"""The engine's step as a GPU must run it, checked on the CPU with the device-side paths forced (dense
experts, the torch step rule, tables and masks built from the step's inputs): no op reads a tensor back
to the host between the step's inputs and its one read of the decisions (a TorchDispatchMode records
them), torch.compile traces the device step whole (0 graph breaks), the MoE paths without host reads
agree with the sparse one, and the CUDA-graph flag is refused where it cannot work."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llada_lsp import Engine, load_model
from llada_lsp.engine.scheduler import Scheduler, StepInputs

aten = torch.ops.aten
# Ops whose result the host must wait for, or whose output shape depends on the data (the same thing:
# the host reads the data to size the output).
READS_BACK = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default,
              aten.nonzero.default, aten.argwhere.default, aten.masked_select.default, aten.bincount.default,
              aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
              aten.repeat_interleave.Tensor}  # fmt: skip


class HostReads(TorchDispatchMode):
    """Records every op that reads a tensor back to the host, and the step's own read (`mark`)."""

    def __init__(self):
        super().__init__()
        self.events: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        bool_index = func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] or ())
        )
        if func in READS_BACK or bool_index:
            ours = [f for f in traceback.extract_stack() if "llada_lsp/" in f.filename]
            where = f"{ours[-1].filename.split('llada_lsp/')[-1]}:{ours[-1].lineno}" if ours else "?"
            self.events.append(f"{func} at {where}")
        return func(*args, **(kwargs or {}))

    def mark(self) -> None:
        self.events.append("HOST READ")


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_thread_per_module):
    """One torch thread for the module (conftest.torch_threads says why)."""


@pytest.fixture(scope="module")
def model(golden_dir):
    return load_model(golden_dir, device="cpu", dtype=torch.float32)


def forced(model, mode: str = "dense"):
    for layer in model.model.layers:
        if hasattr(layer.mlp, "force"):
            layer.mlp.force = mode


def batch_of_four(model, cases) -> Engine:
    """An engine with 4 sequences running (prompts of different lengths: padded rows, a mask), one
    step already taken (admission and prefill done), one with token healing's first_allowed."""
    engine = Engine(model, max_batch=4)
    ids = list(cases)
    for i, case_id in enumerate(ids[:4]):
        case = cases[case_id]
        healed = [1, 2, 3] if i == 1 else None
        settings = engine.settings(case["prompt_ids"], 64, "quality", mask_id=case["mask_token_id"],
                                   eos_id=case["eos_token_id"], first_allowed=healed)  # fmt: skip
        engine.scheduler.add(settings)
    engine.scheduler.step()
    assert len(engine.scheduler.running) == 4
    return engine


def test_one_step_of_four_reads_the_host_once(model, cases, monkeypatch):
    """Between the step's inputs and its one read of the decisions nothing waits for the device: on a
    GPU each of these would stall the launch queue (and break a CUDA graph's capture)."""
    forced(model)
    try:
        engine = batch_of_four(model, cases)
        mode = HostReads()
        tolist = torch.Tensor.tolist

        def read(self):
            mode.mark()
            return tolist(self)

        monkeypatch.setattr(torch.Tensor, "tolist", read)
        with mode:
            events = engine.scheduler.step()
    finally:
        forced(model, None)
    assert sum(e.draft is not None for e in events) == 4
    assert mode.events == ["HOST READ"], "\n".join(mode.events)


def test_the_device_step_compiles_whole(model, cases):
    """torch._dynamo.explain over the scheduler's device step (what a CUDA graph captures): one graph,
    no break, with the step's real inputs of a batch of 4."""
    forced(model)
    try:
        engine = batch_of_four(model, cases)
        seen = {}
        step = engine.scheduler._device_step

        def keep(*args):
            seen["args"] = args
            return step(*args)

        engine.scheduler._device_step = keep
        engine.scheduler.step()
        torch._dynamo.reset()
        with torch.inference_mode():
            explained = torch._dynamo.explain(step)(*seen["args"])
    finally:
        forced(model, None)
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_the_dense_experts_read_their_weights_in_place_and_fp8_dense_agrees_with_sparse():
    """The dense path multiplies w_down as a transposed view (no [C, E*I] copy), and the FP8 experts
    have a dense path of their own (chunks dequantized, no host sync) with the sparse path's numbers."""
    from llada_lsp.model import fp8
    from llada_lsp.model.config import LLaDA2Config
    from llada_lsp.model.llada2 import SparseMoE

    for quantized in (False, True):
        extra = {"quantization_config": dict(fp8.QUANTIZATION_CONFIG)} if quantized else {}
        config = LLaDA2Config(hidden_size=136, moe_intermediate_size=130, num_experts=20, num_experts_per_tok=2,
                              n_group=2, topk_group=1, num_shared_experts=0, **extra)  # fmt: skip
        torch.manual_seed(0)
        moe = SparseMoE(config).eval()
        with torch.no_grad():
            moe.gate.weight.normal_()
            for name in ("w_gate", "w_up", "w_down"):
                w = torch.randn(getattr(moe.experts, name).shape) * 0.1
                if quantized:
                    q, scale = fp8.quantize(w)
                    getattr(moe.experts, name).copy_(q)
                    getattr(moe.experts, f"{name}_scale_inv").copy_(scale)
                else:
                    getattr(moe.experts, name).copy_(w)
        x = torch.randn(1, 7, 136)
        moe.force = "sparse"
        want = moe(x)
        moe.force = "dense"
        mode = HostReads()
        with mode, torch.no_grad():
            got = moe(x)
        assert not mode.events, mode.events
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if not quantized:
            w_down = moe.experts.w_down
            assert w_down.transpose(1, 2).data_ptr() == w_down.data_ptr()  # what bmm reads: the same memory


def test_cuda_graphs_are_refused_off_cuda(model):
    engine = Engine(model)
    with pytest.raises(ValueError, match="CUDA"):
        Scheduler(model, engine.cache, cuda_graph=True)


def test_step_inputs_stay_in_place(model, cases):
    """The same shapes reuse the same buffers step after step (nothing allocated per step on the device)."""
    engine = batch_of_four(model, cases)
    inputs: StepInputs = engine.scheduler.inputs
    before = {k: v[1].data_ptr() for k, v in inputs.buffers.items()}
    engine.scheduler.step()
    after = {k: v[1].data_ptr() for k, v in inputs.buffers.items() if k in before}
    assert before and after == {k: before[k] for k in after}


def test_the_static_shapes_a_cuda_graph_replays_give_the_same_drafts(model, cases):
    """With cuda_graph on, a step runs padded to its bucket: 3 sequences as 4 rows, keys rounded up to
    a key bucket, token healing's constraint always applied. Here the device step runs eagerly at those
    shapes (no CUDA): the drafts must be those of the unpadded steps."""

    def serve(static: bool):
        engine = Engine(model, max_batch=3)
        sched = engine.scheduler
        if static:
            sched.cuda_graph = True
            sched._graphed = lambda *args: sched._device_step(*args)  # the capture itself needs CUDA
        for i, case in enumerate(list(cases.values())[:3]):
            sched.add(
                engine.settings(
                    case["prompt_ids"],
                    case["gen_length"],
                    "quality",
                    mask_id=case["mask_token_id"],
                    eos_id=case["eos_token_id"],
                    first_allowed=[5, 6, 7] if i == 2 else None,
                )
            )
        drafts = [(e.id, e.draft.block_tokens) for e in sched.drain() if e.draft is not None]
        return drafts, {k[1] for k in sched.inputs.buffers}

    plain, _ = serve(False)
    padded, shapes = serve(True)
    assert padded == plain
    rows = {shape[0] for shape in shapes}
    assert 4 in rows and 3 not in rows, f"3 rows run as a bucket of 4: {rows}"
