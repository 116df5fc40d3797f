"""Capturing a test body as a CUDA graph, as preparation does: warm-up, then capture."""

from __future__ import annotations

import torch


def capture(body, *, pool=None, stream: torch.cuda.Stream | None = None):
    """Run ``body`` once on a side stream (its kernels compile there), capture it on that
    stream into ``pool``, synchronize. Returns (graph, what the captured call returned)."""
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = body()
    torch.cuda.synchronize()
    return graph, out
