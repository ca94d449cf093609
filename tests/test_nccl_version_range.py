"""PHANTORA_NCCL_VERSION outside the releases whose tuners the model restates (old_tuners.py: every tag from
v2.17.1-1 to v2.30.7-1 diffed) is a one-line error naming the variable, not 2.17's or 2.30's rules by another name."""

from __future__ import annotations

import pytest

from phantora.cli import main
from phantora.collectives.nccl.settings import settings_from_env
from phantora.errors import InputError


@pytest.mark.parametrize("text", ["2.10", "2.16.5", "2.31", "3.0"])
def test_unknown_release_refused(text: str) -> None:
    with pytest.raises(InputError) as got:
        settings_from_env({"PHANTORA_NCCL_VERSION": text})
    assert got.value.field == "PHANTORA_NCCL_VERSION" and "2.17 to 2.30" in str(got.value)


@pytest.mark.parametrize(("text", "release"), [("2.17", (2, 17, 0)), ("2.17.1", (2, 17, 1)), ("v2.30.7-1", (2, 30, 7))])
def test_known_releases_kept(text: str, release: tuple[int, int, int]) -> None:
    assert settings_from_env({"PHANTORA_NCCL_VERSION": text}).nccl_release == release


def test_nccl_tests_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.10")
    assert main(["nccl-tests", "all_reduce_perf", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "PHANTORA_NCCL_VERSION" in err[0]
