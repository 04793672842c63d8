"""The engine's CUDA-graph steps on a CUDA device (part of the device run; skipped elsewhere, with the
reason): the golden cases give the same tokens and step counts with each step replayed from the graph
of its bucket as eagerly, and the graphs are reused across steps rather than captured per step."""

from __future__ import annotations

import pytest
import torch

from llada_lsp import Engine, load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_graph_steps_give_the_eager_tokens(golden_dir, cases, batch):
    model = load_model(golden_dir, device="cuda", dtype=torch.float32)
    chosen = list(cases.values())[:batch]

    def serve(graph: bool):
        engine = Engine(model, max_batch=batch, cuda_graph=graph, cache_mb=64)
        ids = [engine.scheduler.add(engine.settings(c["prompt_ids"], c["gen_length"], "quality",
                                                    mask_id=c["mask_token_id"], eos_id=c["eos_token_id"]))
               for c in chosen]  # fmt: skip
        results = {e.id: e.result for e in engine.scheduler.drain() if e.result is not None}
        return [(results[i].tokens, results[i].steps) for i in ids], engine.scheduler

    eager, _ = serve(False)
    graphed, sched = serve(True)
    assert graphed == eager
    assert 0 < len(sched.graphs) < sched.stats.steps, "a graph per bucket, replayed, not one per step"
