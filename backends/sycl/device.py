"""The SYCL device and its program: dpctl imported with the venv's OpenCL CPU runtime, a device selected, the OpenCL
C kernels (kernels.cl, exl3.cl) built once per device and process.

Contract
--------
- ``import_dpctl()``: the dpctl module; OCL_ICD_FILENAMES points at the venv's OpenCL CPU runtime first when unset.
- ``select_device(device)``: a SyclDevice from None (default selector), a filter string or a SyclDevice.
- ``built(dpctl, dp, dev)``: (context, program, {kernel name: kernel}), shared by every backend on the device.
Each raises BackendUnavailable with a one-line reason when dpctl, the device or the build is missing.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from moetier.run.contract import BackendUnavailable

_SRC = (Path(__file__).with_name("kernels.cl"), Path(__file__).with_name("exl3.cl"))


def _icd_path() -> str:
    return sys.prefix + "/lib/libintelocl.so"


def import_dpctl():
    """Import dpctl (setting OCL_ICD_FILENAMES to the venv's OpenCL CPU runtime first, when unset).

    Returns the dpctl module; raises BackendUnavailable with a one-line reason.
    """
    if "dpctl" not in sys.modules and not os.environ.get("OCL_ICD_FILENAMES") and os.path.exists(_icd_path()):
        os.environ["OCL_ICD_FILENAMES"] = _icd_path()
    try:
        import dpctl
        import dpctl.memory  # noqa: F401
        import dpctl.program  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(f"--backend sycl: dpctl not installed ({e}): pip install 'moetier[sycl]'") from None
    return dpctl


def select_device(device=None):
    """A SyclDevice from None (default selector), a filter string, or a SyclDevice; BackendUnavailable if none."""
    dpctl = import_dpctl()
    if isinstance(device, dpctl.SyclDevice):
        return device
    try:
        return dpctl.SyclDevice(device) if device else dpctl.select_default_device()
    except Exception as e:  # SyclDeviceCreationError and friends
        raise BackendUnavailable(
            f"--backend sycl: no SYCL device{f' {device!r}' if device else ''} "
            f"(OCL_ICD_FILENAMES={os.environ.get('OCL_ICD_FILENAMES', '<unset>')}): {type(e).__name__}: {e}") from None


_KERNELS = ("quant_rows", "i8_gate_up", "i8_down", "i4_gate_up", "i4_down",
            "exl3_in", "exl3_out", "exl3_gemm", "exl3_decode", "exl3_swiglu",
            "exl3i_in", "exl3i_out", "exl3i_gemm", "exl3i_gate")
_BUILT: dict = {}     # device filter string -> (context, program, kernels): one build per device and process


def built(dpctl, dp, dev):
    """The kernels built once per device and process: every backend on it shares the context and the program
    (building per backend cost an OpenCL compile at every backend start)."""
    key = dev.filter_string
    hit = _BUILT.get(key)
    if hit is not None:
        return hit
    try:
        q = dpctl.SyclQueue(dev, property="in_order")
    except Exception as e:
        raise BackendUnavailable(f"--backend sycl: cannot create a queue on {dev.name}: {e}") from None
    try:
        prog = dp.create_program_from_source(q, "\n".join(p.read_text() for p in _SRC),
                                             "-cl-fp32-correctly-rounded-divide-sqrt")
    except Exception as e:
        raise BackendUnavailable(f"--backend sycl: OpenCL C kernels did not build on {dev.name} "
                                 f"({dev.backend}; dpctl builds OpenCL C only for OpenCL devices): {e}") from None
    hit = _BUILT[key] = (q.sycl_context, prog, {n: prog.get_sycl_kernel(n) for n in _KERNELS})
    return hit
