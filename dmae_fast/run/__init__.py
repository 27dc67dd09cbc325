"""A certification run over a dataset: its config, the run driver (one process or a ``torchrun``
rank: a world of one or many), image and sample shards, results files, resume and the run record."""
