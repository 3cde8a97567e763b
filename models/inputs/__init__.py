"""How a user's text and pixels become what a model reads: tokenizers (SentencePiece, Hugging Face tokenizer.json, the
GGUF vocabularies) and images (decoded, capped, converted). Below the families, which call them in their entry points
(docs/ARCHITECTURE.md §2)."""
