"""A certification run over a dataset: its config, the run driver (one process or a ``torchrun``
rank, see :mod:`dmae_fast.distributed`), image and sample shards, resume and the run record."""
