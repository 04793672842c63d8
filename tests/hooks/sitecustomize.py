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

if os.environ.get("LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT") == "1":
    import scripted_next_edit

    scripted_next_edit.install()
