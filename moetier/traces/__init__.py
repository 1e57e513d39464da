"""Routing traces: the on-disk format and its validation, statistics, and the synthetic generator."""
