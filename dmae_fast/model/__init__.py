"""Networks: the DMAE pre-training model (:mod:`.dmae`), the smoothing base classifier (:mod:`.classifier`), their
configurations (:mod:`.config`, torch-free: every command's parser reads it) and checkpoints (:mod:`.checkpoints`)."""
