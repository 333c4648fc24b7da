"""Figures of what a capsule net computed, drawn with matplotlib and torchvision: shared by the training
callbacks (TensorBoard) and by ``capsexp.use.explain`` (a figure per predicted image)."""
