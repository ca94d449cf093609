"""ECMP: how a node chooses among equal-cost next hops. Two policies, mirrored bit for bit in C++
(``ns3-scratch/model/phantora-routing.*``) so the flow and packet engines put a flow on one path.

``phantora``
    ``splitmix(flow_key, node) % n`` over the next hops sorted by neighbour id. The flow key is
    any 64-bit number (collectives use one per (channel, src, dst), like one NCCL queue pair).

``hpcc``
    The HPCC RDMA models' switch (``SwitchNode::GetOutDev``): MurmurHash3 (x86, 32-bit) of the
    12-byte key ``sip, dip, sport | dport << 16`` (three 32-bit words, read as the host stores them),
    seeded with the switch's node id, modulo the number of next hops. Addresses are HPCC's
    ``node_id_to_ip``. The flow key's low 32 bits are the port word ``sport | dport << 16``: HPCC flow
    files give keys so (source ports per host from 10000, in file order); other flows' keys give
    arbitrary but fixed ports. An ACK hashes the reversed tuple (dip, sip, dport | sport << 16).
    Next hops come in the order HPCC's routing BFS (``CalculateRoute`` in ``third.cc``) appends them:
    the order in which the BFS from the destination dequeues them. That BFS visits a node's
    neighbours in ``std::map<Ptr<Node>>`` order, i.e. by object address; on Linux/glibc every
    ``SwitchNode`` (2.1 MB, its ``m_bytes`` counters) is its own mmap, placed below the previous
    one, while hosts come from the heap below: hosts first, then switches by *descending* id.
    ``hpcc_neighbour_rank`` encodes that order (docs/packet-model.md, "ECMP").
"""

from __future__ import annotations

from collections.abc import Sequence

ECMP_HASHES = ("phantora", "hpcc")
HPCC_FIRST_SPORT = 10000  # third.cc: portNumder[host] = 10000, then one more per flow the host starts
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
NIC_HASH_BIT = 1 << 62  # set in the ECMP input of a flow through the NICs (`ecmp_input`)


def ecmp_input(key: int, via_nic: bool) -> int:
    """What the ECMP hash reads for a flow of ECMP `key`: the key, with `NIC_HASH_BIT` set for a flow through the
    NICs (the word the ns-3 model's packet headers carry to its switches, `packet.ns3_key`, beside the route's own
    `viaNic` field); so both engines hash such a flow alike, onto the paths it took when the bit was part of its
    key. The bit only moves the hash: the route is `via_nic`."""
    return key | NIC_HASH_BIT if via_nic else key


def splitmix_hash(flow_key: int, node: int) -> int:
    """phantora's hash: a deterministic 64-bit splitmix64 finaliser of a flow key at a node."""
    z = (flow_key * 0x9E3779B97F4A7C15 + node * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def murmur3_32(words: Sequence[int], seed: int) -> int:
    """MurmurHash3 x86_32 of ``4 * len(words)`` bytes given as 32-bit words (no tail bytes)."""
    h = seed & _MASK32
    for word in words:
        k = (word & _MASK32) * 0xCC9E2D51 & _MASK32
        k = _rotl32(k, 15) * 0x1B873593 & _MASK32
        h = _rotl32(h ^ k, 13)
        h = (h * 5 + 0xE6546B64) & _MASK32
    h ^= 4 * len(words)
    h ^= h >> 16
    h = h * 0x85EBCA6B & _MASK32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _MASK32
    return h ^ (h >> 16)


def hpcc_ip(node: int) -> int:
    """HPCC's address of a node: 0x0b000001 + (id / 256 << 16) + (id % 256 << 8)."""
    return 0x0B000001 + ((node // 256) << 16) + ((node % 256) << 8)


def hpcc_port_key(sport: int, dport: int) -> int:
    """The flow key that makes the ``hpcc`` hash see these ports: ``sport | dport << 16``."""
    if not (0 <= sport <= 0xFFFF and 0 <= dport <= 0xFFFF):
        raise ValueError(f"ports must be 0..65535, got sport {sport}, dport {dport}")
    return sport | dport << 16


def hpcc_hash(src: int, dst: int, flow_key: int, node: int) -> int:
    """HPCC's ``EcmpHash`` of a packet from endpoint ``src`` to ``dst`` at switch ``node``."""
    return murmur3_32((hpcc_ip(src), hpcc_ip(dst), flow_key & _MASK32), node)


def hpcc_neighbour_rank(node: int, is_switch: bool) -> tuple[int, int]:
    """Sort key of HPCC's neighbour iteration (object addresses): endpoints by id, then switches by
    descending id."""
    return (1, -node) if is_switch else (0, node)


def check_ecmp_hash(name: str) -> str:
    """`name` if it is a known policy, else ValueError listing them."""
    if name not in ECMP_HASHES:
        raise ValueError(f"unknown ECMP hash {name!r} (known: {', '.join(ECMP_HASHES)})")
    return name
