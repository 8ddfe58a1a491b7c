"""Experiments made of runs: sweeps over plans and seeds, and the reports and aggregates
(tables, curves) read back from their run directories."""
