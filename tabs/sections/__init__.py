"""Sections that several text tabs include in their layout (a view over the tab's kept input, with its handlers)."""
