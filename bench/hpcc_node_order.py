"""Which order does the HPCC models' routing BFS visit a node's neighbours in?

HPCC's third.cc keeps neighbours in ``std::map<Ptr<Node>, ...>``, ordered by object address. This builds
``bench/hpcc_node_order.cc`` against the ns3 wheel; it allocates objects of SwitchNode's and SwitchMmu's
sizes and plain nodes in node-id order, as third.cc does, and prints the ids in address order. The
``hpcc`` ECMP policy (phantora.topology.ecmp.hpcc_neighbour_rank) assumes hosts first by id, then
switches by descending id; this prints whether the probe agrees, for HPCC's fat-tree (320 hosts, 56
switches) and a 16-host leaf-spine. Only the switches' order matters to routing (the BFS queues
switches only), and whether hosts come before them; the hosts' own order may wobble where the heap
reuses freed memory.

    .venv/bin/python bench/hpcc_node_order.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import ns3  # the wheel: headers and libraries

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.topology.ecmp import hpcc_neighbour_rank

HERE = Path(__file__).resolve().parent
CASES = {"fat-tree (HPCC mix/fat.txt shape)": (376, range(320, 376)), "leaf-spine 16": (22, range(16, 22))}


def build(out: Path) -> Path:
    root = Path(next(iter(ns3.__path__)))
    lib = root / "lib64"
    ver = next(p.name[len("libns3.") : -len("-core.so")] for p in lib.glob("libns3.*-core.so"))
    exe = out / "hpcc_node_order"
    cmd = ["g++", "-O2", "-std=c++20", f"-I{root / 'include'}", str(HERE / "hpcc_node_order.cc"), "-o", str(exe)]
    cmd += [f"-L{lib}", f"-lns3.{ver}-core", f"-lns3.{ver}-network", f"-Wl,-rpath,{lib}"]
    subprocess.run(cmd, check=True)
    return exe


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        ok = True
        for name, (count, switches) in CASES.items():
            sw = set(switches)
            got = [int(x) for x in subprocess.run([str(exe), str(count), *map(str, sw)], check=True,
                                                  capture_output=True, text=True).stdout.split()]  # fmt: skip
            want = sorted(sw, key=lambda v: hpcc_neighbour_rank(v, True))
            first_switch = min(got.index(v) for v in sw)
            same = [v for v in got if v in sw] == want and all(v in sw for v in got[first_switch:])
            ok &= same
            head = " ".join(str(v) for v in got if v in sw)[:80]
            print(f"{name}: switches in address order: {head} ...  matches hpcc_neighbour_rank: {same}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
