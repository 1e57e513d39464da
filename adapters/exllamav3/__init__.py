"""The exllamav3 adapter: exllamav3 1.6.5's BlockSparseMLP routed through moetier's planner, ledger and lanes.

See docs/adapters.md. Modules: ``surface`` (the pinned hook surface and its check), ``standin`` (the compiled
extension's stand-in for machines without CUDA), ``checkpoint`` (the tiny model: a synthetic EXL3 checkpoint built into
the engine's classes), ``backend`` (the moetier backend the runtime drives over the engine's memory), ``redirect``
(the engine's loader handed moetier's slots for the routed experts) and ``attach`` (the hooks on each MoE block;
``moetier_load``). The experts' bytes are a moetier store of exl3 records. Importing the package imports neither
torch nor exllamav3.
"""
