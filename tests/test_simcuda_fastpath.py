"""The fast path of an op on the simulated GPU (simcuda/fastpath.py) charges, counts and wraps as the general route.

One rank under the roofline model: an element-wise add of two 2^20-element fp32 tensors moves 3 x 4 MiB through
HBM, so it takes ceil(12 MiB / bandwidth) ns plus the launch overhead; its output is 4 MiB of device memory; a
view launches nothing; an in-place op returns its input. The same ops with the fast path switched off give the
same figures. An op repeated ten times takes the fast path each time, is costed by the model once (then from its
cache) and charged the closed form each time, and its ten live outputs hold ten times their bytes of device memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_fastpath.py"
N = 1 << 20


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_fast_path_charges_the_roofline_and_matches_the_general_route(tmp_path: Path, tensors: str) -> None:
    out = tmp_path / "fastpath.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, gpu="h100", tensors=tensors,
                     compute_model="roofline", trace="none", timeout_s=300))  # fmt: skip
    seen = json.loads(out.read_text())
    on, off = seen["on"], seen["off"]
    assert on["fast_ops"] >= 3  # the add, the in-place add and the view at least took it
    add_ns = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    for route in (on, off):
        assert route["device"] == "cuda:0"
        assert route["add_ns"] == pytest.approx(add_ns, abs=1) and route["inplace_ns"] == pytest.approx(add_ns, abs=1)
        assert route["view_ns"] == 0 and route["view_shape"] == [2, N // 2]
        assert route["added_bytes"] == 4 * N
        assert route["inplace_is_input"]
        assert route["max"][1:] == ["cuda:0", "cuda:0"]
        if tensors == "real":
            assert route["sum"] == 3.0 * N and route["a_sum"] == 3.0 * N and route["max"][0] == 4 * 3.0
    assert on["max_ns"] == pytest.approx(off["max_ns"], abs=1)
    # ten repeats of one op (bf16, N/2 elements: 3 x N bytes each): the fast path took each, the model computed
    # the cost once (the others were cache hits), each was charged the closed form, and each output is right
    repeat_ns = math.ceil(3 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    assert on["repeat_taken"] == 10 and on["repeat_computed"] == 1
    for route in (on, off):
        assert route["repeat_ns"] == pytest.approx(10 * repeat_ns, abs=10)
        assert route["repeat_out"] == [["cuda:0", "torch.bfloat16", [N // 2]]]
        assert route["repeat_added_bytes"] == 10 * (N // 2) * 2  # ten bf16 outputs of N/2 elements, 512-B aligned
        if tensors == "real":
            assert route["repeat_value"] == 2.0
