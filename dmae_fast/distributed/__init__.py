"""Distribution over processes: what torchrun's environment says (``torchrun_env``), the ranks of a run and
their collectives (``ranks``), and ``dmae-certify --nproc-per-node``'s local launcher (``launch``)."""
