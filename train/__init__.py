"""Data loaders, tokeniser training, training loops and evaluation commands for the shipped models.

Commands (each takes ``--data-dir``, default ``../shared/data`` relative to the repository):

- ``python -m train.download --out DIR``: fetch the public originals (needs a network).
- ``python -m train.tokenizers``: train the SentencePiece models into ``runs/tokenizers``.
- ``python -m train.translation``, ``python -m train.classifier --task sst2|agnews``,
  ``python -m train.vision --model vit|swin``: train and write a checkpoint folder.
- ``python -m train.evaluate translation|classification|vision``: score a checkpoint on any file.
"""
