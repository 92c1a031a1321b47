"""The command line. `parser` defines every subcommand and its flags, `commands` their
bodies, `worker` the process torchrun starts for each rank."""

from .parser import main

__all__ = ["main"]
