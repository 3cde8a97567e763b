"""The analyses over the families: their walks, the score split, patching, attribution, arrays, and the views over
the walk such as qk.py (§1, §2, §10)."""
