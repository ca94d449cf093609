"""PHANTORA_NCCL_VERSION outside the releases whose tuners the model restates (old_tuners.py: every tag from
v2.17.1-1 to v2.30.7-1 diffed) is a one-line error naming the variable, not 2.17's or 2.30's rules by another name;
NCCL_CTA_POLICY's names are read from the release that has them."""

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


@pytest.mark.parametrize("version", ["2.27.3", "2.28", "2.29.1"])
def test_cta_policy_names_need_2_29_2(version: str) -> None:
    """NCCL 2.27 - 2.29.1 read NCCL_CTA_POLICY as an integer (init.cc NCCL_PARAM(CtaPolicy)) and ignore a name; the
    names came with 2.29.2's getEnvCtaPolicyOnce. A digit is read by every release."""
    with pytest.raises(InputError) as got:
        settings_from_env({"PHANTORA_NCCL_VERSION": version, "NCCL_CTA_POLICY": "EFFICIENCY"})
    assert got.value.field == "NCCL_CTA_POLICY" and "2.29.2" in str(got.value)
    assert settings_from_env({"PHANTORA_NCCL_VERSION": version, "NCCL_CTA_POLICY": "1"}).cta_policy == 1


@pytest.mark.parametrize("version", ["2.29.2", "2.29", "2.30"])
def test_cta_policy_names_from_2_29_2(version: str) -> None:
    env = {"PHANTORA_NCCL_VERSION": version, "NCCL_CTA_POLICY": "EFFICIENCY"}
    assert settings_from_env(env).cta_policy == 1
