"""anisweep: how the geometry of transformer representations forms during training."""

__version__ = "0.1.0"
