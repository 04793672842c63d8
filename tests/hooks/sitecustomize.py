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

# LLADA_LSP_TEST_LOAD_GATE: a model load waits until that path exists (at most 10 minutes), so a test
# acts while the model surely loads, and ends the load when it chooses.
_load_gate = os.environ.get("LLADA_LSP_TEST_LOAD_GATE")
if _load_gate:
    import time

    from llada_lsp.backends import native

    _gated_load = native.load

    def _load_after_gate(*args, **kwargs):
        deadline = time.monotonic() + 600
        while not os.path.exists(_load_gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        return _gated_load(*args, **kwargs)

    native.load = _load_after_gate

if os.environ.get("LLADA_LSP_TEST_SCRIPTED_NEXT_EDIT") == "1":
    import scripted_next_edit

    scripted_next_edit.install()

# With LLADA_LSP_TEST_CANVAS_LOG set to a path, every sequence the native engine takes appends one JSON
# line there: the ids its canvas starts from in the generated region (masks included) and the mask id,
# so a test sees whether a generation started from a draft (a warm start) or from masks.
_canvas_log = os.environ.get("LLADA_LSP_TEST_CANVAS_LOG")
if _canvas_log:
    import json

    from llada_lsp.backends import native  # no torch: the engine is imported when a model loads

    _add = native.NativeBatch.add

    def _logged_add(self, request) -> int:
        seq_id = _add(self, request)
        seq = next(e.seq for e in self.scheduler.waiting if e.id == seq_id)
        start = seq.P
        canvas = seq.host[start : start + seq.settings.gen_length]
        with open(_canvas_log, "a") as log:
            log.write(json.dumps({"canvas": canvas, "mask": seq.settings.mask_id}) + "\n")
        return seq_id

    native.NativeBatch.add = _logged_add

# With LLADA_LSP_TEST_PROMPT_LOG set to a path, every job the server runs appends one JSON line there:
# its label and the texts of the other files' snippets it carries (what its prompt starts with), so a
# test sees what reached a prompt, whatever the server's own log says.
_prompt_log = os.environ.get("LLADA_LSP_TEST_PROMPT_LOG")
if _prompt_log:
    import json

    from llada_lsp.server import language_server

    _run_job = language_server.LladaServer.run_job

    async def _logged_run_job(self, key, label, job, on_draft=None):
        texts = [s["text"] if isinstance(s, dict) else s.text for s in (getattr(job, "context", None) or ())]
        paths = [s["path"] if isinstance(s, dict) else s.path for s in (getattr(job, "context", None) or ())]
        with open(_prompt_log, "a") as f:
            f.write(json.dumps({"label": label, "paths": paths, "texts": texts}) + "\n")
        return await _run_job(self, key, label, job, on_draft)

    language_server.LladaServer.run_job = _logged_run_job

# With LLADA_LSP_TEST_SWAP set to "PATH::fifo" or "PATH::link:TARGET", the first time the server resolves
# PATH's real path (after its checks that it is a regular file inside the workspace) the file at PATH is
# replaced by a FIFO or by a symbolic link to TARGET, and every resolution of PATH answers PATH as before
# the swap: the file changes between the check and the open, every time, deterministically.
_swap = os.environ.get("LLADA_LSP_TEST_SWAP")
if _swap:
    import os.path

    _target, _, _kind = _swap.partition("::")
    _realpath = os.path.realpath
    _swapped = []

    def _swapping_realpath(path, *args, **kwargs):
        if os.fspath(path) == _target:
            if not _swapped:
                _swapped.append(True)
                os.unlink(_target)
                if _kind == "fifo":
                    os.mkfifo(_target)
                else:
                    os.symlink(_kind.removeprefix("link:"), _target)
            return _target
        return _realpath(path, *args, **kwargs)

    os.path.realpath = _swapping_realpath
