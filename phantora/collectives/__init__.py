"""Collectives -> flow DAGs, NCCL-like (see docs/collectives.md)."""

from phantora.collectives.dag import FlowDag
from phantora.collectives.decompose import decompose
from phantora.collectives.metrics import collective_metrics
from phantora.collectives.options import default_options
from phantora.collectives.spec import AlgoOptions, Collective

__all__ = ["AlgoOptions", "Collective", "FlowDag", "collective_metrics", "decompose", "default_options"]
