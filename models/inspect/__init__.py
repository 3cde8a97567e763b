"""The analyses over the families: their walks, the score split, patching, attribution, and the views over the walk
such as qk.py (docs/ARCHITECTURE.md §1, §2, §10)."""
