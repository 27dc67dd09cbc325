"""Results files: the format Cohen et al.'s tools read (:mod:`.format`), the writer that keeps every
row safe (:mod:`.writer`), the checks of kept or analyzed rows (:mod:`.checks`) and the part files of a
multi-process run (:mod:`.parts`)."""
