"""`Chain`: a lower bound of a flow's end from its chain of single dependencies, without walking the chain.

A flow that waits on one flow only ends no earlier than that flow's end + its own step (delay + its least transfer
time), and no earlier than its own bound or its worker's floor. Along a chain x_0 <- x_1 <- ... (each x_i waiting on
x_{i-1} alone), with S_i the sum of the steps of x_0..x_i, the bound of x_i pulled up the chain is therefore
S_i + the most, over the unfinished x_j (j <= i), of (x_j's bound, or its worker's floor) - S_j, and of the end of
the flow before the first unfinished one - its S. The chain keeps S, the first unfinished flow, the positions whose
bound rose after it was placed, and each worker's positions, so a bound costs the number of rises and workers on the
chain, not its length (issue 38, item 2: the decomposition
driver's horizon re-walked each ring's chain every round).
"""

from __future__ import annotations


class Chain:
    """Flows each waiting on the one before (the head on `deps`, if any), their step sums and bound rises."""

    __slots__ = ("after", "deps", "first", "k0", "nodes", "places", "raised", "static", "sums")

    def __init__(self, head: int, step: int, static: int, worker: int, deps: tuple[int, ...]) -> None:
        self.nodes = [head]
        self.sums = [step]  # sums[i]: the steps of nodes[0..i]
        self.static = static  # a bound of every flow of the chain, less its step sum (the head's when placed)
        self.k0 = 0  # the first unfinished flow (flows of a chain end in its order)
        self.after = static  # the end of the flow before k0 (done), less its step sum (static: none yet)
        self.raised: list[int] = []  # positions whose bound rose above static + their step sum
        self.places: dict[int, list[int]] = {}  # worker -> its flows' positions
        self.first: dict[int, int] = {}  # worker -> the index in places[worker] of its first flow from k0 on
        self.deps = deps  # the head's deps (those unfinished count while the head is)
        if worker >= 0:  # (a marker's owner is the driver, -1: no worker's floor applies)
            self.places[worker] = [0]
            self.first[worker] = 0

    def add(self, fid: int, step: int, worker: int) -> int:
        """Append a flow waiting on the last one; its position."""
        pos = len(self.nodes)
        self.nodes.append(fid)
        self.sums.append(self.sums[-1] + step)
        if worker >= 0:
            if worker not in self.places:
                self.places[worker] = []
                self.first[worker] = 0
            self.places[worker].append(pos)
        return pos

    def value(self, pos: int, lbs: dict[int, int], ends: dict[int, int], floors: list[int]) -> int:
        """The bound of the flow at `pos` (unfinished: in `lbs`) from the unfinished flows of the chain up to it,
        each at max(its bound in `lbs`, its worker's floor), and from the end (in `ends`) of the flow before the
        first of them; the head's deps left out."""
        nodes, sums = self.nodes, self.sums
        k = self.k0
        if nodes[k] not in lbs:
            while nodes[k] not in lbs:
                k += 1
            self.k0 = k
            self.raised = [p for p in self.raised if p >= k]
            self.after = max(self.static, ends[nodes[k - 1]] - sums[k - 1])
        best = self.after
        for p in self.raised:
            if p <= pos:
                a = lbs[nodes[p]] - sums[p]
                if a > best:
                    best = a
        first = self.first
        for w, places in self.places.items():
            i = first[w]
            n = len(places)
            while i < n and places[i] < k:
                i += 1
            first[w] = i
            if i < n and places[i] <= pos:
                a = floors[w] - sums[places[i]]
                if a > best:
                    best = a
        return best + sums[pos]
