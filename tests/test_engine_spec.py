"""`EngineSpec`: one validated description of the engine, carried whole over the wire (msgpack)."""

from __future__ import annotations

import msgpack
import pytest

from phantora.errors import InputError
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.packet_config import PacketConfig

G = 10**9


def test_a_spec_survives_msgpack_field_for_field() -> None:
    """Rate maps keep integer keys, CC attributes their text: the server rebuilds exactly the launcher's spec."""
    packet = PacketConfig(cc="dcqcn", kmin_map={100 * G: 20_000}, kmax_map={100 * G: 80_000}, cc_attrs={"G": "0.5"})
    spec = EngineSpec("ns3", packet, window_ns=10_000)
    wire = msgpack.unpackb(msgpack.packb(spec.to_dict(), use_bin_type=True), raw=False, strict_map_key=False)
    back = EngineSpec.from_dict(wire)
    assert back == spec and back.packet.kmin_map == {100 * G: 20_000}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"network": "ns2"}, "network"),
        ({"window_ns": -1}, "window_ns"),
        ({"window_ns": 1.5}, "window_ns"),
        ({"side": "packet"}, "side"),
    ],
)
def test_bad_specs_name_their_field(kw: dict, field: str) -> None:
    with pytest.raises(InputError) as e:
        EngineSpec(**kw)
    assert e.value.field == field


def test_unknown_fields_on_the_wire_are_named() -> None:
    with pytest.raises(InputError) as e:
        EngineSpec.from_dict({"network": "flow", "windw_ns": 0})
    assert e.value.field == "windw_ns"
    with pytest.raises(InputError) as e:
        EngineSpec.from_dict({"network": "ns3", "packet": {"bufer_bytes": 1}})
    assert e.value.field == "packet.bufer_bytes"


def test_the_flow_engine_reads_its_fields_of_the_packet_config() -> None:
    """Flow: ECMP policy and load balancing from --set; at the packet config's goodput only when asked (netsim)."""
    spec = engine_spec_from_flags("flow", sets=["ecmp_hash=hpcc", "lb=spray"])
    assert spec.flow_options() == {"ecmp_hash": "hpcc", "lb": "spray"}
    assert spec.packet_used is None and spec.window_ns == 0
    netsim = engine_spec_from_flags("flow", sets=["payload_bytes=1000", "header_bytes=48"], flow_goodput=True,
                                    flow_fields=("payload_bytes", "header_bytes"))  # fmt: skip
    assert netsim.flow_options()["payload_efficiency"] == 1000 / 1048
    with pytest.raises(InputError, match="ns3 only"):
        engine_spec_from_flags("flow", cc="dcqcn")
