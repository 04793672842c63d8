"""GPU kernels with plain-PyTorch references, inside the package so the model can import them (none
yet: see README.md in this folder)."""
