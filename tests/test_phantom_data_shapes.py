"""Phantom mode's ops whose output shape depends on the data (runtime/data_shapes.py): by default each stops in one
`PhantomValueError` naming the program's call and `PHANTORA_PHANTOM_SHAPES`; with `upper` or a fraction F each takes
ceil(F n) of its n elements (closed forms below); `repeat_interleave` of phantom counts has no bound and stops in
every setting; a boolean index that holds values (host data) is exact. Real mode: torch's CPU results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.launcher import RunConfig, launch
from phantora.runtime import data_shapes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "phantom_data_shapes.py"
N, ROWS, COLS = 48, 6, 8  # the script's 6 x 8 tensor
ASSUMED = (
    "mask",
    "row mask",
    "nonzero",
    "where",
    "argwhere",
    "masked_select",
    "unique",
    "unique rows",
    "unique_consecutive",
)


def _shapes(f: float) -> dict[str, list[int]]:
    """The closed forms: ceil(f n) of n elements (rows for a row mask and unique rows)."""
    n, r = math.ceil(f * N), math.ceil(f * ROWS)
    return {
        "mask": [n], "row mask": [r, COLS], "nonzero": [n, 2], "where": [n], "argwhere": [n, 2],
        "masked_select": [n], "unique": [n], "unique rows": [r, COLS], "unique_consecutive": [n],
    }  # fmt: skip


def _run(tmp_path: Path, tensors: str) -> tuple[dict, dict]:
    seen_file = tmp_path / "seen.json"
    out = tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=1, tensors=tensors, out_dir=out))
    return json.loads(seen_file.read_text()), json.loads((out / "results.json").read_text())


def test_real_mode_is_torchs_cpu_result(tmp_path: Path) -> None:
    seen, _ = _run(tmp_path, "real")
    for name, case in seen.items():
        assert case.get("equal") and case["device"] == "cuda:0", (name, case)
    assert seen["kept mask"]["shape"] == [3, COLS]


def test_phantom_mode_stops_in_one_line_naming_the_call(tmp_path: Path) -> None:
    seen, _ = _run(tmp_path, "phantom")
    for name in (*ASSUMED, "repeat_interleave"):
        case = seen[name]
        assert case["error"] == "PhantomValueError" and "\n" not in case["text"], (name, case)
        assert "lambda t:" in case["text"], (name, case)  # the program's line, quoted
    for name in ASSUMED:
        assert "PHANTORA_PHANTOM_SHAPES=upper" in seen[name]["text"], name
    assert "torch.nonzero_static" in seen["mask"]["text"]
    assert "output_size=" in seen["repeat_interleave"]["text"]
    assert seen["kept mask"] == {"shape": [3, COLS], "device": "cuda:0"}  # the host mask's count, exactly


@pytest.mark.parametrize("setting, fraction", [("upper", 1.0), ("0.3", 0.3)])
def test_phantom_mode_assumes_the_size_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, fraction: float
) -> None:
    monkeypatch.setenv("PHANTORA_PHANTOM_SHAPES", setting)
    seen, results = _run(tmp_path, "phantom")
    for name, shape in _shapes(fraction).items():
        assert seen[name] == {"shape": shape, "device": "cuda:0"}, name
    assert seen["repeat_interleave"]["error"] == "PhantomValueError"  # no bound to assume
    assert seen["kept mask"]["shape"] == [3, COLS]
    shapes = results["phantom_shapes"]
    assert shapes["assumed"] == setting
    assert len(shapes["sites"]) == len(ASSUMED) and all("phantom_data_shapes.py:" in s for s in shapes["sites"])


@pytest.mark.parametrize("bad", ["0", "1.5", "all", "-0.2"])
def test_a_bad_setting_names_the_variable(bad: str) -> None:
    with pytest.raises(InputError, match="PHANTORA_PHANTOM_SHAPES"):
        data_shapes.setting({"PHANTORA_PHANTOM_SHAPES": bad})
    assert data_shapes.setting({}) == ("error", None)
    assert data_shapes.setting({"PHANTORA_PHANTOM_SHAPES": "upper"}) == ("upper", 1.0)
