"""The exl3xpu adapter: exl3xpu's (Intel Arc) MoE method routed through moetier's planner, ledger and lanes.

See docs/adapters.md. Modules: ``surface`` (the pinned ``torch.ops.exl3xpu_moe`` op surface, the blob layout
constants and their check), ``ops`` (moetier's provider of that op surface where exl3xpu is not installed), ``ring``
(the VRAM victim ring read from the host), ``model`` (the tiny Qwen-layout model: a synthetic EXL3 checkpoint around
the method), ``backend`` (the moetier backend over the ops' memory) and ``attach`` (the hook on the method's
``apply``). Importing the package imports neither torch nor exl3xpu.
"""
