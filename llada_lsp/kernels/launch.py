"""One kernel launch as data: the JIT function, its grid, its arguments and its compile-time options.

The launchers build these and run them; llada_lab/aot.py binds the same ones (on the meta device) to
compile every variant for real GPU targets without a GPU. Knows nothing of what the kernels compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Launch:
    kernel: Any  # a triton.JITFunction (or the interpreter's stand-in)
    grid: tuple[int, ...]
    args: tuple  # positional, in the kernel's order
    meta: dict  # constexprs and launch options (num_warps, num_stages)

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)
