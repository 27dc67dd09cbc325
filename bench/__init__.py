"""Throughput and end-to-end benchmarks (installed as ``dmae_fast.bench``); results in bench/results/.

Arrives with the fast-path issue.
"""
