"""SYCL lanes (dpctl, OpenCL C kernels): device slots for the gpu lane, USM host RAM slots for zerocopy/cpu.

Extra: pip install 'moetier[sycl]'. See docs/backend-sycl.md.
"""
