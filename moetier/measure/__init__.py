"""Measurement: the machine sheet (bench), runtime-against-simulator calibration, and the host probe."""
