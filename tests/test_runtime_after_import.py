"""`after_import`: callbacks run once the watched module's body has run, or at once if it already has."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phantora.runtime.after_import import after_import


def test_callback_runs_after_the_module_body_and_at_once_when_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "phx_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("VALUE = 41\ndef get():\n    return VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def patch(module) -> None:
        seen.append(module.VALUE)  # the body has run: its names exist
        module.VALUE = 42

    after_import("phx_pkg.helpers", patch)
    assert seen == [] and "phx_pkg.helpers" not in sys.modules  # nothing imported on our account
    from phx_pkg import helpers  # type: ignore[import-not-found]

    assert seen == [41] and helpers.get() == 42
    after_import("phx_pkg.helpers", lambda m: seen.append(m.VALUE))
    assert seen == [41, 42]  # already imported: called at once
    for name in ("phx_pkg.helpers", "phx_pkg"):
        sys.modules.pop(name, None)
