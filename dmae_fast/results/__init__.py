"""Results files: their format (Cohen et al.'s tools read it), the writer, the checks of kept or analyzed rows and
the part files of a multi-process run."""
