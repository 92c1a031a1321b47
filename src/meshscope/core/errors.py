"""The one error type users see.

A `UsageError` is bad input (a layout that does not multiply into the world, a shape not divisible by
the parallel size, splits that do not sum, an unknown experiment). The CLI prints its message as one
line, exits with code 2 and writes nothing: every entry point validates before it touches disk.
"""


class UsageError(ValueError):
    """Bad user input; the message names the value and what would be valid."""
