"""Capsule operations and layers (pure ``torch.nn``)."""
