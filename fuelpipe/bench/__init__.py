"""Decode benchmarks: per-token latency of replan and plan_once, side by side."""
