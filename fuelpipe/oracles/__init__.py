"""Correctness oracles: each compares the decode runtime against an independent expectation.

Every oracle has a negative control: injecting the fault it exists to catch
must make it fail (see ``registry.ORACLES``).
"""
