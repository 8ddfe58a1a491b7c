"""A trained agent outside training: loading a checkpoint as a ``Policy``, exporting it (ONNX,
safetensors), and the ``nitro enjoy``/``nitro export`` commands."""
