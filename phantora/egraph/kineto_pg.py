"""Which process group over its ranks a Kineto trace's call runs on: its `pg` (docs/egraph.md, types 12 and 13).

torch's profiler names each call's group (``Process Group Name`` in the args of ``record_param_comms`` and of the
NCCL kernel) and lists the rank's groups in creation order (``distributedInfo.pg_config``: pg_name, ranks). Two
groups over the same ranks are two NCCL communicators, so their calls are numbered and matched apart. A call's
`pg` is the number of groups over its ranks (a transfer: holding both ends) created before its own, the same on
every member. Creation order: numeric names (torch's default, a global counter) by value, before any other name
(hashed or user-given), which keep the order the traces list them in. A call without a group name is on pg 0.
"""

from __future__ import annotations

from typing import Any

from phantora.errors import InputError

PG_NAME = "Process Group Name"


class PgTable:
    """Every process group named in a job's traces: its ranks, in creation order."""

    def __init__(self) -> None:
        self._ranks: dict[str, tuple[int, ...]] = {}
        self._order: dict[str, tuple[int, int, int]] = {}

    def add(self, name: str, ranks: tuple[int, ...]) -> None:
        """Group `name` over global `ranks` (the first listing of a name holds)."""
        if name not in self._ranks:
            self._ranks[name] = ranks
            num = int(name) if name.isdigit() else 0
            self._order[name] = (0 if name.isdigit() else 1, num, len(self._order))

    def add_config(self, info: dict[str, Any], src: str) -> None:
        """The groups a trace's ``distributedInfo.pg_config`` lists (torch 2.4+), in its order."""
        configs = info.get("pg_config")
        if configs is None:
            return
        if not isinstance(configs, list):
            raise InputError("must be a list of groups", file=src, field="distributedInfo.pg_config")
        for i, cfg in enumerate(configs):
            where = f"distributedInfo.pg_config[{i}]"
            name, ranks = (cfg.get("pg_name"), cfg.get("ranks")) if isinstance(cfg, dict) else (None, None)
            if name is None or not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                raise InputError("a group needs 'pg_name' and a list of integer 'ranks'", file=src, field=where)
            self.add(str(name), tuple(ranks))

    def pg_of(self, name: str | None, group: tuple[int, ...]) -> int:
        """A collective's pg: the groups over `group` created before `name`."""
        if name is None:
            return 0
        self.add(name, group)
        key = self._order[name]
        return sum(1 for n, r in self._ranks.items() if r == group and self._order[n] < key)

    def p2p_pg_of(self, name: str | None, src: int, dst: int, group: tuple[int, ...]) -> int:
        """A transfer's pg: the groups holding both `src` and `dst` created before `name` (over `group`)."""
        if name is None:
            return 0
        self.add(name, group)
        key = self._order[name]
        return sum(1 for n, r in self._ranks.items() if src in r and dst in r and self._order[n] < key)


def pg_name(args: dict[str, Any]) -> str | None:
    """The group name a call's args carry, if any."""
    name = args.get(PG_NAME)
    return None if name is None or name == "" else str(name)
