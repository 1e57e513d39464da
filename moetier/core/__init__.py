"""The pure core: records (load, validate, resolve), the residency ledger, the planner, the NVMe channel model,
predictors, the host-cache model and the simulator. Nothing here imports backends, the runtime, the CLI or the
measurement code; everything here is deterministic given its inputs."""
