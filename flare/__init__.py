"""Flare: an LLM inference server with prepared cores and CUDA-graph execution."""

__version__ = "0.1.0"
