"""The peers and the oracle bound, above the simulator: what each system decides, as moetier's policies
(moetier.peers.rows), and ``moetier compare``'s harness (moetier.peers.compare) that times every row on one recipe and
trace, with each row's distance from the oracle split into replacement and read-ahead (moetier.peers.gap). The
residency mechanisms the rows name stay in the pure core (moetier.core.policies)."""
