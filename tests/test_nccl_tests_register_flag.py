"""nccl-tests' -R and the NCCL that runs, as nccl-tests 2.19.6 reads them (src/common.cu, main's getopt loop).

-R N: any non-zero N other than 2 calls ncclCommRegister on the buffers (common.cu registers `if (local_register)`
and takes a window only for `local_register == SYMMETRIC_REGISTER`), so -R 3 and -R -1 are -R 1. The -R 2 and -x
version checks compare test_ncclVersion, ncclGetVersion's code of the NCCL that runs: PHANTORA_NCCL_VERSION.
"""

from __future__ import annotations

import pytest

from phantora.cli import main

BASE = ["nccl-tests", "all_reduce_perf", "-b", "16M", "-e", "16M", "-n", "1", "-w", "0"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    assert main(argv) == 0
    got = capsys.readouterr()
    return [ln for ln in got.out.splitlines() if ln.strip() and not ln.startswith("#")], got.err


@pytest.mark.parametrize("value", ["3", "-1"])
def test_other_non_zero_r_registers_locally(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A 16 MiB all-reduce on 8 H100s: -R 3 and -R -1 run NVLS on NCCL's 4 registered CTAs, as -R 1 (16 CTAs
    without registration)."""
    one, _ = _run([*BASE, "-R", "1"], capsys)
    none, _ = _run([*BASE, "-R", "0"], capsys)
    got, _ = _run([*BASE, "-R", value], capsys)
    assert "algorithm=NVLS" in one[0] and "channels=4 " in one[0] and "channels=16 " in none[0]
    assert got == one


def test_version_checks_use_the_running_nccl(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under PHANTORA_NCCL_VERSION=2.26 -R 2 prints nccl-tests' line and registers locally; under 2.27.3 -x 2 prints
    its line and is ignored; under 2.30 neither line."""
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.26")
    _, err = _run([*BASE, "-R", "2"], capsys)
    assert "Option -R 2 (symmetric) is not supported before NCCL 2.27. Defaulting to local registration" in err
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    _, err = _run([*BASE, "-R", "1", "-x", "2"], capsys)
    assert "Option -x (cta_policy) 2 is not supported before NCCL 2.28. Ignoring" in err
    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.30")
    _, err = _run([*BASE, "-R", "2", "-x", "2"], capsys)
    assert "Option" not in err
