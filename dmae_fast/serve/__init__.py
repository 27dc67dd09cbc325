"""``dmae-serve``: a smoothed classifier as an HTTP service with continuous batching (docs/serving.md).

The procedures are :mod:`dmae_fast.stats.procedure`'s, shared with dmae-certify.
"""
