"""Engine adapters: each subpackage attaches one inference engine's MoE blocks to moetier's planner and lanes.

See docs/adapters.md. ``adapters.surface`` is the engine-independent hook-surface check every adapter uses.
"""
