"""Skip rule of the tests of an optional extra: without the extra they skip with the reason, unless the run names
the extra in MOETIER_TEST_REQUIRE (comma-separated, as .ci/run does), where a missing extra or device fails."""
from __future__ import annotations

import os

import pytest


def required(extra: str) -> bool:
    return extra in {e.strip() for e in os.environ.get("MOETIER_TEST_REQUIRE", "").split(",")}


def missing(extra: str, why: str) -> None:
    """Skip (module-level too) because ``extra`` is missing, or fail when this run requires it."""
    if required(extra):
        pytest.fail(f"the {extra} extra is required here (MOETIER_TEST_REQUIRE) but {why}", pytrace=False)
    pytest.skip(f"{why} (the {extra} extra: pip install 'moetier[{extra}]')", allow_module_level=True)
