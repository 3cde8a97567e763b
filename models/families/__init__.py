"""One file per model family, each registered once in models/registry.py (docs/ARCHITECTURE.md §1, §7)."""
