"""Policies over the ledger, records and traces: tier replacement (residency), the peers' placement and lane rules
(peers), and the oracle bound. Pure: no I/O."""
