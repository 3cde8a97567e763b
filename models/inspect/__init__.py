"""The analyses over the families: their walks, the score split, patching, attribution, arrays (§1, §2)."""
