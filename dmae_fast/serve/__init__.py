"""``dmae-serve``: a smoothed classifier as an HTTP service with continuous batching (docs/serving.md)."""
