"""A Nitro plugin package: the A2C algorithm and the ``warmup`` boost scaler.

Installed, it adds ``[algo] name = "a2c"`` and ``[scaler] name = "warmup"`` to every plan through
the ``nitro.plugins`` entry point (see ``descriptors.py``); ``python -m kernel plugins`` lists them.
"""
