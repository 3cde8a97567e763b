"""What the model families are built from: attention, positions, the shared layers, the decoder block description and
the decoding loop (docs/ARCHITECTURE.md §1)."""
