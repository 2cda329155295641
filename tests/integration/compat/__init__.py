"""Unmodified user scripts for the compatibility matrix (tests/integration/test_compat_matrix.py)."""
