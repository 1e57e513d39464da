"""The core's parity suite: reference replays recorded from the tree before the compiled core (tests.parity.record)."""
