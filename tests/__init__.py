
import pytest

# tests/helpers/ holds no tests, but its asserts should report like a test's own.
pytest.register_assert_rewrite("tests.helpers")
