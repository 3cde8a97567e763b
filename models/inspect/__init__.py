"""Analyses that read a model through its walk (the per-family description of its residual stream)."""
