"""Training data: documents, the bundled default mix, user formats, splits and packing."""
