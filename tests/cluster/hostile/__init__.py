"""Hostile-tenant cluster tests (issue 21): one module per attack."""
