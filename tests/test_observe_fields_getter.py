"""`observe.fields_getter`: a fabric record's fields as `dataclasses.astuple` gives them, as a sort key and on the
wire (the decomposition driver's merged records, `bridge.protocol.records_to_wire`)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from bridge.protocol import RECORD_KINDS
from phantora.netsim.observe import FlowTransport, PfcEvent, fields_getter

RECORDS = sorted(RECORD_KINDS.values(), key=lambda c: c.__name__)  # every record the driver merges and the wire carries


def _sample(cls: type, rng: random.Random) -> object:
    """A record of `cls` with small random values of each field's type (ties likely)."""
    values = {
        "int": lambda: rng.randint(0, 3),
        "float": lambda: rng.choice([0.5, 0.25]),
        "bool": lambda: rng.random() < 0.5,
    }
    return cls(*(values[str(f.type)]() for f in dataclasses.fields(cls)))


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_is_flat_so_its_fields_are_astuples(cls: type) -> None:
    # a field that is a list, a map or a record would make astuple copy it: the getter would not be its equal
    assert all(str(f.type) in ("int", "float", "bool") for f in dataclasses.fields(cls))
    assert len(dataclasses.fields(cls)) >= 2  # (one name would make attrgetter give the value, not a tuple)
    rng = random.Random(7)
    for _ in range(20):
        r = _sample(cls, rng)
        assert fields_getter(cls)(r) == dataclasses.astuple(r)


def test_sorted_by_it_in_astuples_order_ties_kept_in_place() -> None:
    rng = random.Random(3)
    rows = [PfcEvent(rng.randint(0, 2), rng.randint(0, 2), 1, 0, 3, rng.random() < 0.5, 9) for _ in range(500)]
    by_astuple = sorted(rows, key=dataclasses.astuple)
    got = sorted(rows, key=fields_getter(PfcEvent))
    assert all(a is b for a, b in zip(got, by_astuple, strict=True))  # the same objects in the same places
    assert fields_getter(FlowTransport)(FlowTransport(5, 1, 4096, 2, 8192)) == (5, 1, 4096, 2, 8192)
