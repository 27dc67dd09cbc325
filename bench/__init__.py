"""Throughput and end-to-end benchmarks (installed as ``dmae_fast.bench``); results in bench/results/.

``dmae_fast.bench.command`` (dmae-bench) parses into config (its light configurations) and runs
suite, which drives: throughput (rows), engines (the exports it times), e2e (CERTIFY timings),
reference_loops, flops, peak, report; gpu_session.sh is the one-call GPU session and
compare_counts its results-file check (docs/performance.md).
"""
