"""The engine service's GPU flags reach the engine: `--prefill-chunk` and `--cuda-graph` become the
loaded engine's settings, and CUDA graphs asked for on a machine without CUDA are refused as a load
error with the reason (never a traceback)."""

from __future__ import annotations

import pytest

from llada_lsp.backends.native import load
from llada_lsp.commands.engine import parser
from llada_lsp.completion.generation import ModelSpec
from llada_lsp.errors import CheckpointError


def test_the_flags_parse():
    args = parser().parse_args(["--prefill-chunk", "256", "--cuda-graph"])
    assert args.prefill_chunk == 256 and args.cuda_graph is True
    defaults = parser().parse_args([])
    assert defaults.prefill_chunk is None and defaults.cuda_graph is False


def test_prefill_chunk_reaches_the_scheduler(one_torch_thread):
    model = load(ModelSpec(None, threads=1, prefill_chunk=64), lambda *_: None)
    assert model.batch.scheduler.prefill_chunk == 64


def test_cuda_graphs_without_cuda_are_a_load_error(one_torch_thread):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    with pytest.raises(CheckpointError, match="cuda_graph"):
        load(ModelSpec(None, threads=1, cuda_graph=True), lambda *_: None)
