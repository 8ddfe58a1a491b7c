"""Transports: where weights wait for the actors and batches wait for the learner (in memory
for embedded runs, Redis streams for actors on other machines)."""
