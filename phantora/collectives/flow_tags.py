"""The tags a collective's flows carry (flows.csv `tag`): which call, on which ranks.

A call's name counts its group's collectives (`all_reduce#3`: the fourth all-reduce on its ranks), so two groups
(or two shifted copies of one under rank deduplication) name their calls alike; the tag adds the ranks:

- a collective: `all_reduce#3@0-7` (ranks 0 to 7), `all_gather#0@0-56:8` (0, 8, ..., 56), `reduce#1@0.2.5`;
- a send/recv: `send#2@0>1` (rank 0 to rank 1), with a user tag other than 0 `send#2.tag7@0>1`;
- a transfer of a collective that runs pair by pair (scatter, gather, uneven all-to-all): its collective's tag and
  the pair, `all_to_all#1@0-3/0>2`.

The engines append their own parts after a `/` (`/ring/step0`, `/ch1`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

Shift = Callable[[tuple[int, ...]], tuple[int, ...]]
PAIRWISE_CODES = {"scatter": 1, "gather": 2, "all_to_all": 3}  # collectives that run as transfers (their p2p tags)


def ranks_text(ranks: Sequence[int]) -> str:
    """Ranks as a short text: `a-b` (consecutive), `a-b:s` (every s-th, three or more), else `.`-joined."""
    rs = [int(r) for r in ranks]
    if len(rs) >= 3:
        step = rs[1] - rs[0]
        if step > 0 and all(b - a == step for a, b in zip(rs, rs[1:], strict=False)):
            return f"{rs[0]}-{rs[-1]}" + (f":{step}" if step > 1 else "")
    return ".".join(map(str, rs))


def parse_ranks(text: str) -> tuple[int, ...]:
    """The ranks `ranks_text` wrote."""
    if "-" in text:
        span, _, step = text.partition(":")
        a, _, b = span.partition("-")
        return tuple(range(int(a), int(b) + 1, int(step or 1)))
    return tuple(int(r) for r in text.split("."))


def call_name(kind: str, seq: int, tag: int = 0, pg: int = 0) -> str:
    """A call's name on its ranks: `kind#seq`, with its process group if not the first over its ranks (`.pg1`:
    RankSession.comm_of) and its p2p tag if not 0 (a pairwise collective's are negative)."""
    return f"{kind}#{seq}" + (f".pg{pg}" if pg else "") + (f".tag{tag}" if tag else "")


def record_kind(kind: str, name: str) -> str:
    """The kind of the call a coordinator record is part of: a pair of a collective NCCL runs as sends and receives
    (kind `send_recv`, named `collective_tag(call_name("all_to_all", 1), group)`) is the collective's."""
    return name.partition("#")[0] if kind == "send_recv" and "@" in name else kind


def collective_tag(name: str, group: Sequence[int]) -> str:
    """The tag of collective `name` on `group`."""
    return f"{name}@{ranks_text(group)}"


def transfer_tag(name: str, src: int, dst: int, shift: Shift | None = None) -> str:
    """The tag of a transfer from `src` to `dst` named `name`: a send's, or (a name with `@ranks`) one pair of that
    collective; `shift` carries the collective's ranks to the copy the pair belongs to (rank deduplication)."""
    if "@" not in name:
        return f"{name}@{src}>{dst}"
    base, _, text = name.partition("@")
    if shift is not None:
        text = ranks_text(shift(parse_ranks(text)))
    return f"{base}@{text}/{src}>{dst}"


def group_tag(group: Sequence[int], kind: str) -> int:
    """The negative p2p tag of the transfers of a pairwise collective `kind` on `group` (user tags are >= 0)."""
    crc = zlib.crc32(",".join(map(str, group)).encode()) & 0xFFFFFF
    return -(1 + PAIRWISE_CODES[kind] + 8 * crc)


def pairwise_groups(groups: Sequence[Sequence[int]]) -> dict[int, tuple[str, tuple[int, ...]]]:
    """The pairwise collective kind and group behind each p2p tag `group_tag` gives `groups`."""
    return {group_tag(g, kind): (kind, tuple(g)) for g in groups for kind in PAIRWISE_CODES}
