"""The one exception type for problems caused by the user's input.

Command-line entry points catch :class:`UserError` and print its message as one line
with a non-zero exit code; everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: a missing file, a wrong format, an out-of-range option, ..."""
