"""Every reader of weights, into the families: checkpoint folders, Hugging Face folders (one module per family group),
the Hub, torchvision weights, models larger than one device (docs/ARCHITECTURE.md §1)."""
