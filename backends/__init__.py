"""moetier compute backends (one package per lane kind)."""
