"""CUDA backend (CuPy): see backends/cuda/backend.py and docs/backend-cuda.md."""
