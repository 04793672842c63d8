"""Which kernels run in this process: decided once, into one object (`Backend`), the first time anything
asks (`current()`: a model's load, the first step), logged in one line (`announce`) and shown by `llada-lsp
plan`, `llada-lsp engine status` and the server's `llada/status` (`Backend.line`).

The rungs, best first; each is taken only when the one above it cannot be:
1. CPU: numba kernels whose GEMMs call torch's own `sgemm`, found in torch's CPU library through ctypes
   (`gemm="torch"`): a product is torch's bit for bit. True of torch's x86 Linux wheels (MKL, exported);
   it is no API, so its absence is a rung, not an error.
2. CPU: the same kernels with a portable GEMM (`gemm="portable"`: numba loops, kernels/cpu.py): slower
   (docs/model.md has the figure), never different in kind: the same flat layers and the same step
   kernels run; the products agree with torch's within float32 rounding, not to the bit. Forced with
   LLADA_LSP_GEMM=portable.
3. CPU: no kernels (`cpu=False`): numba is not installed, LLADA_LSP_KERNELS=0 was set when the process
   started, or the kernels failed to compile here (`give_up`, at the warm-up of a load). The model's
   modules and the engine's torch step run.
GPU: the Triton kernels where triton is installed and LLADA_LSP_KERNELS is not 0 (`gpu`); a GPU they do
not support, or a kernel that fails to compile there (kernels.FALLBACKS), takes the torch path per call.

Imports neither torch nor numba (`llada-lsp plan` shows the line without them; kernels/cpu.py imports
numba where the backend says so). Knows nothing of modules, checkpoints or decoding policy.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

SWITCH = "LLADA_LSP_KERNELS"  # "0": no kernels at all (numba is not even imported: ~120 MiB)
GEMM_SWITCH = "LLADA_LSP_GEMM"  # "portable": the portable GEMM even where torch's sgemm is found


@dataclass(frozen=True)
class Backend:
    cpu: bool  # the numba kernels run (the CPU runner's flat layers, the engine's step kernels)
    gemm: str  # "torch" (torch's own sgemm: exact), "portable" (numba loops: within rounding), "none"
    gpu: bool  # the Triton kernels may run on a CUDA GPU that supports them
    why: str = ""  # why the CPU is not on the best rung ("" where it is)
    # the ctypes function of torch's sgemm (gemm "torch"), else None. The kernels take it as an argument:
    # numba caches no function that holds a ctypes pointer as a global (the pointer is the process's own)
    sgemm: object = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def exact(self) -> bool:
        """Whether the CPU kernels' products are torch's bit for bit (its own GEMM routine)."""
        return self.gemm == "torch"

    def line(self) -> str:
        """The one line a log, `llada-lsp plan`, `engine status` and `llada/status` show."""
        if self.cpu:
            gemm = "torch's sgemm, exact" if self.exact else "portable GEMM, within rounding of torch's"
            cpu = f"CPU numba kernels ({gemm})"
        else:
            cpu = "CPU torch ops (no kernels)"
        gpu = "GPU Triton kernels where the GPU takes them" if self.gpu else "GPU torch ops (no Triton kernels)"
        return f"{cpu}; {gpu}" + (f"; because {self.why}" if self.why else "")

    def as_dict(self) -> dict:
        return {"cpu": self.cpu, "gemm": self.gemm, "exact": self.exact, "gpu": self.gpu, "why": self.why,
                "line": self.line()}  # fmt: skip


_current: Backend | None = None
_announced = False


def current() -> Backend:
    """The process's backend, decided on first use (`decide`) and kept."""
    global _current
    if _current is None:
        _current = decide()
    return _current


def decide(environ=None, find_gemm=None) -> Backend:
    """The best rung this machine allows (the module's docstring): the one place the backend is chosen."""
    env = os.environ if environ is None else environ
    if env.get(SWITCH, "1") == "0":
        return Backend(False, "none", False, f"{SWITCH}=0")
    gpu = importlib.util.find_spec("triton") is not None
    if importlib.util.find_spec("numba") is None:
        return Backend(False, "none", gpu, "numba is not installed")
    if env.get(GEMM_SWITCH) == "portable":
        return Backend(True, "portable", gpu, f"{GEMM_SWITCH}=portable")
    sgemm = (find_gemm or find_torch_sgemm)()
    if sgemm is None:
        return Backend(True, "portable", gpu, "torch's CPU library exports no sgemm (not an MKL x86 build)")
    return Backend(True, "torch", gpu, "", sgemm)


def numba():
    """The numba module, or None where it is not installed or LLADA_LSP_KERNELS=0 (then not imported)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    try:
        return importlib.import_module("numba")
    except ImportError:  # pragma: no cover - numba is a dependency; a platform without its wheels runs torch
        return None


def find_torch_sgemm():
    """The Fortran sgemm (32-bit integers) that torch's CPU library carries (MKL's, in the x86 wheels), as
    a ctypes function, else None: the routine torch.mm and F.linear call, so a kernel calling it with the
    arguments they pass gets torch's products bit for bit (tests/kernels/test_cpu_kernels.py), and dispatches
    nothing. Windows names the library otherwise, macOS arm64 uses Accelerate, aarch64 OpenBLAS or oneDNN:
    there the portable GEMM runs."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - torch is a dependency
        return None
    for path in glob.glob(os.path.join(spec.submodule_search_locations[0], "lib", "libtorch_cpu.*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # pragma: no cover - a library of another platform's name
            continue
        for name in ("sgemm_", "sgemm", "SGEMM"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_void_p] * 13, None
                return fn
    return None  # pragma: no cover - a torch build without a BLAS of its own


def announce() -> Backend:
    """Logs the backend's line once per process (a model's load calls it); returns the backend."""
    global _announced
    backend = current()
    if not _announced:
        _announced = True
        log.info("kernels: %s", backend.line())
    return backend


def give_up(err: BaseException) -> None:
    """The CPU kernels off for the rest of the process (their warm-up failed: `err`), said once in the log."""
    global _current
    reason = (
        f"the CPU kernels failed to compile here ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    )
    _current = dataclasses.replace(current(), cpu=False, gemm="none", why=reason, sgemm=None)
    log.warning("kernels: %s", _current.line())
