"""The statistics of certification: bounds, decisions from class counts, sampling plans, procedures (PREDICT,
fixed-n CERTIFY, sequential tests) and ``--sound``'s exact noise thresholds. numpy and scipy only (and mpmath for
those thresholds): nothing here imports torch or any other part of dmae_fast but :mod:`dmae_fast.base.errors`,
and this file imports nothing, so that a light module (:mod:`.settings`) costs no numpy."""
