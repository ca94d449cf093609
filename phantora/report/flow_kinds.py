"""Which of a run's flows used the network: the one selection compare, sweep, the seed summary and the plots share."""

from __future__ import annotations

import numpy as np

from phantora.results.read import Flows


def network_flows(flows: Flows) -> np.ndarray | None:
    """The flows with bytes that left through the NICs (flows.csv `nvlink` 0), as a mask; None where flows.csv
    does not say which flows stayed on NVLink (written before its `nvlink` column) or no flow has bytes."""
    real = flows.size > 0
    if not real.any() or not bool((flows.nvlink[real] >= 0).all()):
        return None
    return real & (flows.nvlink == 0)
