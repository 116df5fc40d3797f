"""Test doubles and developer tools: not product code (nothing in flare/ outside this package imports it).

- ``fake_engine``: FakeEngine, a deterministic byte-level model behind the Engine protocol,
  served by ``python -m flare.testing.fake_engine`` for tests and HTTP benchmarks.
"""
