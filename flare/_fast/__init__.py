"""Compiled hot paths (Cython). Each module has a .pxd stating its contract."""
