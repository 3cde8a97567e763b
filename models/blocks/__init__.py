"""What the model families are built from: attention, positions, the shared layers (docs/ARCHITECTURE.md §1)."""
