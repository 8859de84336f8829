"""The rltrace version."""

__version__ = "0.1.0"
