"""Sinks: observers of the bus that write what users read (console, JSON lines, CSV,
TensorBoard, W&B, MLflow), all naming the numbers of a round through ``metrics``.

Each tracker imports its library only when built: ``nitro plugins`` reads the descriptors
without importing any of them.
"""
