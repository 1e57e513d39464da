"""CPU lane: Numba kernels over expert records held in RAM (extra: pip install moetier[cpu])."""
