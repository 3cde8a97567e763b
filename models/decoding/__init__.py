"""Serving-side speed the model store applies (fp16 packing, the fast and batched decoding); no family knows it."""
