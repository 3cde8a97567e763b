"""Serving-side speed (fp16 packing, the fast, on-device and batched decoding); each runner reads the decoder block
description and refuses what it does not know (docs/ARCHITECTURE.md §7); no family knows it."""
