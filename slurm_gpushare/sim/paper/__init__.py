"""The FGD paper's harness: FGD, BestFit, Random, their GPU state, the MIG what-if stand-ins, the paper's workload
family in the checkout's tests/data/gpu-trace (workloads.py). Pure.

Used by bench/ and the tests only (no product module imports it: tests/unit/test_import_graph.py); left out of
the wheel (pyproject.toml)."""
