"""The fixed settings of the statistics that command options name, in a module that imports
nothing, so that ``dmae-certify --help`` and option errors answer without numpy."""

FUTILITY_MODES = ("none", "deterministic", "upper")
SEQUENTIAL_TESTS = ("exact", "bonferroni")  # --sequential-test: group_sequential.py (default), sequential.py
# the smallest alpha the exact sequential test calibrates in double precision (group_sequential.py)
SMALLEST_SEQUENTIAL_ALPHA = 1e-300
PAPER_RADII = (0.5, 1.0, 1.5, 2.0, 3.0)  # the paper's radii of interest (the default radii: dmae_fast.stats.radii)
