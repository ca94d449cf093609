"""phantora: a live GPU-cluster simulator for ML training with flow-level and ns-3 packet networks."""

__version__ = "0.1.0"
