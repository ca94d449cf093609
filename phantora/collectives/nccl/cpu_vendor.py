"""The CPU vendor a topology's or a published table's "cpu" text names, as NCCL's topology detection classes hosts
(topo.cc `kvDictCpuArch`, `kvDictCpuVendor`): "arm" (arch arm64: NVIDIA Grace, as on GB200), "amd" (x86
AuthenticAMD) or "intel" (x86 GenuineIntel; NCCL gives any other x86 vendor Intel's figures). The one reader of
that text: the platform (`platform.cpu_vendor`), the P2P-off PCIe host (`nvlink_pci`) and the published tables'
grouping (`spread.machine_key`) all ask it."""

from __future__ import annotations

import re

from phantora.errors import InputError

_CPU_WORDS = (  # (vendor, pattern): the first that matches names the vendor
    ("amd", re.compile(r"\bamd\b|authenticamd|\bepyc\b")),
    ("arm", re.compile(r"\barm\b|\barm64\b|\baarch64\b|\bgrace\b|\bneoverse\b")),
    ("intel", re.compile(r"\bintel\b|genuineintel|\bxeon\b|\bx86(_64)?\b")),
)


def vendor_named(raw: object, field: str = "cpu", file: str | None = None) -> str | None:
    """The vendor `raw` names (a vendor, or free text such as "2x AMD EPYC 7742" or "arm (NVIDIA Grace)"), None for
    None or blank text; text that names none of them is a one-line error naming `field` (and `file`, if given)."""
    if raw is None or str(raw).strip() == "":
        return None
    low = str(raw).lower()
    for vendor, pattern in _CPU_WORDS:
        if pattern.search(low):
            return vendor
    expected = "expected a CPU of intel, amd or arm (e.g. 'AMD EPYC 7742', 'arm')"
    raise InputError(f"{expected}, got {raw!r}", field=field, file=file)
