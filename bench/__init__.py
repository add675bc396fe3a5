"""Benchmarks: Sluice against the published launcher patterns, in virtual time (``make bench``)."""
