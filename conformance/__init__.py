"""moetier backend conformance suite: one backend-agnostic pytest suite, run per backend.

    moetier conformance --backend {cpu,sycl,cuda} [--report PATH] [--write-engine ID]
    pytest -p conformance.report --pyargs conformance --backend NAME -rs

See docs/conformance.md. conformance.capabilities decides skips from the backend's declared capabilities;
conformance.report is the pytest plugin (options, summary table, JSON report); conformance.broken holds deliberately
broken test-only backends used to show the suite catches breakage.
"""
