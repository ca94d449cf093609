"""PacketConfig defaults and HPCC file readers (no ns-3 needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.netsim.hpcc_io import FctLine, format_fct_line, ip_node, node_ip, read_fct_txt, read_hpcc_flows
from phantora.netsim.packet_config import PacketConfig, apply_overrides, read_hpcc_config
from phantora.paths import shared_dir
from tests.stars import star

G = 10**9


def test_defaults_follow_the_reference_scaling() -> None:
    """The fixed defaults; the fabric-scaled ones (buffer, ECN thresholds, headroom: None here, the attribute's 0)
    are resolved by the C++ model and reported by it (tests/test_engine_report.py)."""
    c = PacketConfig()
    assert (c.buffer_bytes, c.kmin_map, c.kmax_map, c.pmax_map, c.headroom_bytes) == (None, None, None, None, None)
    assert dict(c.to_params([100 * G]))["switch.BufferSize"] == "0"
    assert (c.payload_bytes, c.header_bytes, c.reserve_bytes, c.dt_shift) == (1000, 48, 4096, 3)


def test_to_params_lists_overrides_as_attributes() -> None:
    c = PacketConfig(cc="dcqcn", pfc=False, kmin_map={100 * G: 300_000}, cc_attrs={"G": "0.0625"}, rto_ns=5000)
    p = dict(c.to_params())
    assert p["fabric.CongestionControl"] == "dcqcn"  # the registered name; CcRegistry resolves it in C++
    assert p["switch.PfcEnabled"] == "false"
    assert p["switch.KminMap"] == "100000000000 300000"
    assert p["cc.G"] == "0.0625"
    assert p["nic.RetransmitTimeout"] == "5000ns"
    assert p["switch.BufferSize"] == "0"  # None: the switch scales it with its fastest port
    # One field, every object that needs it.
    assert p["nic.HeaderSize"] == p["switch.HeaderSize"] == "48"
    # The go-back-N timeout left unset: none on a lossless fabric, 1 ms without PFC.
    assert dict(PacketConfig().to_params())["nic.RetransmitTimeout"] == "0ns"
    assert dict(PacketConfig(pfc=False).to_params())["nic.RetransmitTimeout"] == "1000000ns"


def test_every_field_is_in_the_attribute_table() -> None:
    from dataclasses import fields

    from phantora.netsim.packet_config import ENGINE_FIELDS, NS3_ATTRIBUTES, field_of_param

    assert {f.name for f in fields(PacketConfig)} - {"cc_attrs", *ENGINE_FIELDS} == set(NS3_ATTRIBUTES)
    for name, (paths, _) in NS3_ATTRIBUTES.items():
        assert all(field_of_param(path) == name for path in paths)


def test_bad_fields_name_the_field() -> None:
    with pytest.raises(InputError, match="congestion control's name"):
        PacketConfig(cc="no such cc")  # names are checked against the library's registry (cc_registry) at use
    with pytest.raises(InputError) as e:
        PacketConfig(payload_bytes=0)
    assert e.value.field == "payload_bytes"
    with pytest.raises(InputError) as e:
        PacketConfig(kmin_map={100 * G: 500}, kmax_map={100 * G: 100})
    assert e.value.field == "kmax_map"


HPCC_CONFIG = """\
ENABLE_QCN 1
USE_DYNAMIC_PFC_THRESHOLD 1
PACKET_PAYLOAD_SIZE 1000
TOPOLOGY_FILE mix/topology.txt
CC_MODE 1
ALPHA_RESUME_INTERVAL 1
RATE_DECREASE_INTERVAL 4
RP_TIMER 900
EWMA_GAIN 0.00390625
FAST_RECOVERY_TIMES 1
RATE_AI 20Mb/s
RATE_HAI 200Mb/s
MIN_RATE 1000Mb/s
U_TARGET 0.95
L2_ACK_INTERVAL 1
ACK_HIGH_PRIO 1
HAS_WIN 0
GLOBAL_T 1
LINK_DOWN 0 0 0
KMAX_MAP 2 100000000000 1600 400000000000 3200
KMIN_MAP 2 100000000000 400 400000000000 800
PMAX_MAP 2 100000000000 0.2 400000000000 0.2
BUFFER_SIZE 32
header_bytes 36
"""


def test_read_hpcc_config(tmp_path: Path) -> None:
    path = tmp_path / "config.txt"
    path.write_text(HPCC_CONFIG)
    c = read_hpcc_config(path)
    assert c.cc == "dcqcn"
    assert c.buffer_bytes == 32 * 2**20
    assert c.kmin_map == {100 * G: 400_000, 400 * G: 800_000}
    assert c.kmax_map == {100 * G: 1_600_000, 400 * G: 3_200_000}
    assert c.pmax_map == {100 * G: 0.2, 400 * G: 0.2}
    assert c.header_bytes == 36
    # DCQCN keys become attributes of ns3::CcDcqcn; HPCC-only keys (U_TARGET) are dropped for DCQCN.
    assert c.cc_attrs["RateAi"] == str(20_000_000)
    assert c.cc_attrs["RpTimer"] == "900000ns"
    assert c.cc_attrs["G"] == "0.00390625"
    assert "TargetUtil" not in c.cc_attrs


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("CC_MODE 10", "CC_MODE"),
        ("PACKET_PAYLOAD_SIZE abc", "PACKET_PAYLOAD_SIZE"),
        ("KMIN_MAP 2 100000000000 400", "KMIN_MAP"),
        ("NOT_A_KEY 1", "NOT_A_KEY"),
        ("ENABLE_QCN 2", "ENABLE_QCN"),
        ("L2_BACK_TO_ZERO 1", "L2_BACK_TO_ZERO"),
        ("payload_bytes 0", "payload_bytes"),
    ],
)
def test_bad_config_names_file_line_and_key(tmp_path: Path, line: str, key: str) -> None:
    path = tmp_path / "config.txt"
    path.write_text("ENABLE_QCN 1\n" + line + "\n")
    with pytest.raises(InputError) as e:
        read_hpcc_config(path)
    assert e.value.file == str(path)
    assert e.value.line == 2
    assert e.value.field == key


def test_hpcc_cc_keys_work_in_set_as_in_a_config_file() -> None:
    dcqcn = PacketConfig(cc="dcqcn")
    c = apply_overrides(dcqcn, ["RATE_AI=20Mb/s", "RP_TIMER=900", "EWMA_GAIN=0.0625"])
    assert c.cc_attrs == {"RateAi": "20000000", "RpTimer": "900000ns", "G": "0.0625"}
    with pytest.raises(InputError) as e:
        apply_overrides(PacketConfig(cc="swift"), ["RATE_AI=20Mb/s"])
    assert e.value.field == "RATE_AI" and "HPCC key of dcqcn, hpcc, timely, not of 'swift'" in str(e.value)


def test_overrides() -> None:
    dcqcn = PacketConfig(cc="dcqcn")
    c = apply_overrides(dcqcn, ["pfc=0", "buffer_bytes=200000", "cc.G=0.5", "kmin_map=100Gbps 1000"])
    assert (c.pfc, c.buffer_bytes, c.cc_attrs, c.kmin_map) == (False, 200_000, {"G": "0.5"}, {100 * G: 1000})
    with pytest.raises(InputError, match="unknown PacketConfig field 'nonsense'.*buffer_bytes.*cc.ATTRIBUTE"):
        apply_overrides(PacketConfig(), ["nonsense=1"])  # the error lists the fields
    assert apply_overrides(dcqcn, ["buffer_bytes=4MB", "rto_ns=1ms"]).buffer_bytes == 4_000_000


@pytest.mark.parametrize(
    ("item", "field", "says"),
    [
        ("buffer_bytes=lots", "buffer_bytes", "expected an integer (or a size like 4MB"),
        ("cc.G=abc", "cc.G", "attribute G of dcqcn takes a number, got 'abc'"),
        ("cc.RpTimer=soon", "cc.RpTimer", "takes a time such as 4us"),
        ("cc.TargetUtil=0.9", "cc.TargetUtil", "'dcqcn' has no attribute 'TargetUtil' (its attributes: Alpha"),
    ],
)
def test_bad_set_values_name_the_field_before_a_run(item: str, field: str, says: str) -> None:
    """--set is checked in full where the command line is read, before any process starts (the one builder of
    the run's EngineSpec): the field and the reason."""
    from phantora.netsim.cli_config import engine_spec_from_flags

    with pytest.raises(InputError) as e:
        engine_spec_from_flags("ns3", cc="dcqcn", sets=[item])
    assert e.value.field == field and says in str(e.value) and "time 'lots'" not in str(e.value)


def test_a_config_files_attributes_of_another_cc_are_dropped_by_cc(tmp_path: Path) -> None:
    from phantora.netsim.cli_config import packet_config_from_flags

    f = tmp_path / "config.txt"
    f.write_text("CC_MODE 1\nEWMA_GAIN 0.00390625\nRP_TIMER 900\n")
    assert packet_config_from_flags(config_file=f).cc_attrs == {"G": "0.00390625", "RpTimer": "900000ns"}
    assert packet_config_from_flags(config_file=f, cc="hpcc").cc_attrs == {}
    assert packet_config_from_flags(config_file=f, cc="dctcp").cc_attrs == {"G": "0.00390625"}


def test_node_ip_matches_the_hpcc_formula() -> None:
    assert node_ip(0) == 0x0B000001
    assert node_ip(1) == 0x0B000101
    assert node_ip(256) == 0x0B010001
    assert all(ip_node(node_ip(i)) == i for i in range(0, 65536, 997))  # 16 bits of node id
    line = FctLine(1, 0, 10000, 100, 1000, 2_000_000_000, 5, 6, 7)
    assert format_fct_line(line, with_id=True) == "0b000101 0b000001 10000 100 1000 2000000000 5 6 7"


def test_read_flows_exact_start_times(tmp_path: Path) -> None:
    path = tmp_path / "flows.txt"
    path.write_text("2\n1 0 3 100 20000000 2.0\n2 0 3 100 5000000 2.0005\n")
    flows = read_hpcc_flows(path, star(8))
    assert [f.start_ns for f in flows] == [2_000_000_000, 2_000_500_000]  # no binary rounding of 2.0005
    assert flows[1].to_flow().id == 1 and flows[1].to_flow().priority == 3
    assert flows[1].to_flow().key == 10000 | 100 << 16  # host 2's first source port, HPCC's port word


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("3\n1 0 3 100 10 2.0\n", 1, None),  # count mismatch
        ("1\n1 0 3 100 10\n", 2, None),  # 5 fields
        ("1\n1 9 3 100 10 2.0\n", 2, "dst"),  # 9 is the switch
        ("1\n1 0 0 100 10 2.0\n", 2, "priority_group"),
        ("1\n1 0 3 100 -5 2.0\n", 2, "size_bytes"),
        ("2\n1 0 3 100 10 2.0\n2 0 3 100 10 1.0\n", 3, "start_seconds"),
        ("1\n1 0 3 100 10 2.0000000001\n", 2, "start_seconds"),
        ("1\n3 3 3 100 10 2.0\n", 2, "dst"),  # from a host to itself
    ],
)
def test_bad_flow_files(tmp_path: Path, text: str, line: int, field: str | None) -> None:
    path = tmp_path / "flows.txt"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read_hpcc_flows(path, star(8))
    assert e.value.file == str(path) and e.value.line == line and e.value.field == field


def test_lines_past_the_announced_count_are_ignored_with_a_warning(tmp_path: Path) -> None:
    """As HPCC does: its own example flow file announces 2 flows, then lists 256 and a usage note."""
    from phantora.errors import InputWarning

    path = tmp_path / "flow.txt"
    path.write_text("2\n1 0 3 100 10 2.0\n2 0 3 100 10 2.0\n4 0 3 100 10 2.0\nusage: not a flow\n")
    with pytest.warns(InputWarning, match=r"flow.txt:1: the header announces 2 flows; the 2 lines .*line 4.* ignored"):
        flows = read_hpcc_flows(path, star(8))
    assert [f.src for f in flows] == [1, 2]


def test_read_reference_fct() -> None:
    ref = shared_dir() / "reference-runs/fct/star8-two_to_one-none.fct.txt"
    if not ref.exists():
        pytest.skip("reference runs not present")
    lines = read_fct_txt(ref)
    assert {(r.src, r.dst) for r in lines} == {(1, 0), (2, 0)}
    assert all(r.size == 10_000_000 and r.start_ns == 2_000_000_000 for r in lines)


def test_set_field_default_gives_back_the_fabric_scaled_default() -> None:
    """`--set buffer_bytes=default`: the value `phantora compare` prints for an unset field is accepted back (a sweep
    axis `"set.buffer_bytes" = ["default", 4000000]`; refused as not an integer before, found in the 2026-12-05 CC
    user trial); on a field with no None default it stays an error."""
    small = apply_overrides(PacketConfig(), ["buffer_bytes=4000000", "headroom_bytes=100000"])
    small = apply_overrides(small, ["kmin_map=400Gbps 100000"])
    back = apply_overrides(small, ["buffer_bytes=default", "headroom_bytes=DEFAULT", "kmin_map=default"])
    assert (small.buffer_bytes, small.kmin_map) == (4_000_000, {400 * G: 100_000})
    assert (back.buffer_bytes, back.headroom_bytes, back.kmin_map) == (None, None, None)
    assert dict(back.to_params([100 * G]))["switch.BufferSize"] == "0"  # 0: the C++ model scales it
    with pytest.raises(InputError, match="payload_bytes"):
        apply_overrides(PacketConfig(), ["payload_bytes=default"])
