"""A test hook, on PYTHONPATH only in the test suite's processes (tests/conftest.py puts this folder
there): with LLADA_LSP_TEST_STEP_DELAY_MS set, the model thread sleeps that long after every batched
denoising step, so the tiny model is as slow as a big one and a cancel or a keystroke lands while a
request runs. Nothing of it is in the package.

With LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT=1, next-edit requests are answered by scripted_next_edit.py
(beside this file) instead of the model, so editor tests see a deterministic suggestion."""

import os

_delay = float(os.environ.get("LLADA_LSP_TEST_STEP_DELAY_MS", "0") or 0) / 1000
if _delay > 0:
    import time

    from llada_lsp.runtime import worker

    _step = worker.ModelWorker._step

    def _slow_step(self) -> None:
        _step(self)
        time.sleep(_delay)

    worker.ModelWorker._step = _slow_step

# LLADA_LSP_TEST_LOAD_DELAY_MS: a model load takes that much longer (a big model on a busy machine),
# so requests surely arrive while it loads.
_load_delay = float(os.environ.get("LLADA_LSP_TEST_LOAD_DELAY_MS", "0") or 0) / 1000
if _load_delay > 0:
    import time

    from llada_lsp.backends import native

    _load = native.load

    def _slow_load(*args, **kwargs):
        time.sleep(_load_delay)
        return _load(*args, **kwargs)

    native.load = _slow_load

if os.environ.get("LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT") == "1":
    import scripted_next_edit

    scripted_next_edit.install()
