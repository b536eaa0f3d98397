"""Benchmarks of comgra_ndbg: recording overhead, graph discovery and layout, policies, and diagbench."""
