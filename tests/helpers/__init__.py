"""Builders and helpers shared by several test files (not tests themselves): a test file
imports them from here, never from another test file. Fixtures shared by several files
are in tests/conftest.py. pytest rewrites their asserts (tests/__init__.py)."""
