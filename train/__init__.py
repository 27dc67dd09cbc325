"""DMAE pre-training, robust fine-tuning and linear probing (installed as ``dmae_fast.train``).

Arrives with the training issue; the models and checkpoint loaders it needs are in
:mod:`dmae_fast.model` and :mod:`dmae_fast.model.checkpoints`.
"""
