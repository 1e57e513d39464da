"""Expert bytes: record layouts and their float64 reference math, the packed record store, and the O_DIRECT
transport that reads records into slots."""
