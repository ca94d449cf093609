"""Network topologies: the `Topology` model, generators, file readers/writers and `load_topology`."""

from phantora.topology.ecmp import ECMP_HASHES, hpcc_hash, splitmix_hash
from phantora.topology.generators import GENERATORS, dgx_host, fat_tree, leaf_spine, pcie_host, rail_optimized
from phantora.topology.loader import find_topology, load_topology, shipped_dir, shipped_names
from phantora.topology.model import Link, Node, Topology
from phantora.topology.readers import read_hpcc, read_simai, write_hpcc, write_simai
from phantora.topology.tomlfile import read_toml

__all__ = [
    "GENERATORS",
    "Link",
    "Node",
    "Topology",
    "dgx_host",
    "ECMP_HASHES",
    "hpcc_hash",
    "splitmix_hash",
    "fat_tree",
    "find_topology",
    "leaf_spine",
    "load_topology",
    "pcie_host",
    "rail_optimized",
    "read_hpcc",
    "read_simai",
    "read_toml",
    "shipped_dir",
    "shipped_names",
    "write_hpcc",
    "write_simai",
]
