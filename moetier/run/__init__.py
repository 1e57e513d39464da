"""The runtime: the backend contract, backend discovery, and the executor that runs the planner's decisions with
real bytes on a backend."""
