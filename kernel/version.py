"""The version of Nitro, apart from the package so that any kernel module can name it without
importing the engine."""

__version__ = "0.1.0"
