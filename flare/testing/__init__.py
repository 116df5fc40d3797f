"""Test doubles and developer tools: not product code (nothing in flare/ outside this package imports it).

- ``fake_engine``: FakeEngine, a deterministic byte-level model behind the Engine protocol,
  run by the real ModelRuntime over FakeExecutor, served by ``python -m flare.testing.fake_engine``
  for tests;
- ``flood_engine``: FloodEngine, FakeEngine's prompts with token events as fast as one thread
  makes them (``python -m flare.testing.flood_engine``), the load source of tools/bench_http.py;
- ``fake_executor``: FakeExecutor, the executor interface over a model-free program
  interpreter (scheduler tests, the fake engine, tools/bench_scheduler.py and tools/bench_host.py).
"""
