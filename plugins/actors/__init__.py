"""Actor backends: how a round's invocations reach the actor function (``local`` worker
processes that behave like Lambda, or ``lambda`` through the Invoke API), and the warm worker
pool they and the local endpoint run the function in.

Nothing is imported here: the backends import torch-free modules only, but each loads what it
needs when it is built, so ``nitro plugins`` and ``nitro validate`` stay light.
"""
