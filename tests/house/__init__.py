"""The house: packaging, docs and their examples, the layout and layers, the image, compat, the demo."""
