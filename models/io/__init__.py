"""Loading and formats: checkpoint folders, Hugging Face folders and the Hub, torchvision weights, tokenizers."""
