"""Batches of noisy samples on a device: the slot scheduler, the engine loop over it, the batch
bodies (plain, fast, CPU workers), the body resolver, fallbacks and the classifier they smooth."""
