"""moetier: tiered expert residency (VRAM / RAM / NVMe) and one scheduler (plan_layer) for MoE decode."""

__version__ = "0.2.0"
