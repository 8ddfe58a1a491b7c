"""Probes: what is measured on the updated policy after each round (evaluation return,
Hessian spectrum, gradient noise scale), for the scalers and the stop rules."""
