"""meshscope: predict, run, verify and explain the communication of N-D parallel training."""

__version__ = "0.1.0"
