"""Shared skip rule of the exllamav3 adapter tests: they need torch and exllamav3 (the optional exllamav3 extra,
installed by .ci/adapters-extra.sh); elsewhere they skip with the reason."""
from __future__ import annotations

import importlib.util

import pytest

MISSING = [m for m in ("torch", "exllamav3", "safetensors") if importlib.util.find_spec(m) is None]
needs_engine = pytest.mark.skipif(
    bool(MISSING), reason=f"exllamav3 adapter tests need {', '.join(MISSING)} (the exllamav3 extra; "
                          f"run .ci/adapters-extra.sh)")
