"""The statistics of certification: bounds, decisions from class counts, sampling plans, procedures (PREDICT,
fixed-n CERTIFY, sequential tests) and ``--sound``'s exact noise thresholds. numpy, scipy and mpmath only: no torch,
nothing of dmae_fast but :mod:`dmae_fast.base`; this file imports nothing, so that :mod:`.settings` costs no numpy."""
