"""A stand-in for SGLang's `sgl_kernel` on a CPU, installed as `sgl_kernel` into the test venv.

SGLang 0.5.23 with SGLANG_USE_CPU_ENGINE=1 imports `sgl_kernel`, whose CPU build is not published as
a wheel. On a CPU without AMX the only function its scheduler calls is `assign_req_to_token_pool_cpu`
(srt/mem_cache/allocation.py): it writes each request's new KV-cache slots into that request's row of
the request-to-token table. This module gives that one function in plain torch; other names import
but raise when called (module __getattr__ below).
"""

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Row req_pool_indices[i], columns start_offset[i]:end_offset[i], get the next slots in order."""
    del pool_len  # the table's row length; torch indexing knows it
    at = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[at : at + n].to(req_to_token.dtype)
        at += n


def __getattr__(name: str):
    """Every other name SGLang imports from sgl_kernel at module level (copy_all_layer_kv_cache_cpu, ...)
    exists, and fails loudly if a CPU path ever calls it: that path then needs a stand-in of its own."""
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: the test stand-in (tests/e2e/sglang) has no CPU version")

    missing.__name__ = name
    return missing
