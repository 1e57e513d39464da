"""The exllamav3 adapter: exllamav3 1.6.5's BlockSparseMLP routed through moetier's planner, ledger and lanes.

See docs/adapters.md. Modules: ``surface`` (the pinned hook surface and its check), ``standin`` (the compiled
extension's stand-in for machines without CUDA), ``checkpoint`` (synthetic EXL3 checkpoints and the tiny model),
``records`` (the expert record store the transport reads), ``backend`` (the moetier backend the runtime drives) and
``attach`` (the hooks on each MoE block). Importing the package imports neither torch nor exllamav3.
"""
