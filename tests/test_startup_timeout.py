"""The start-up limit of a run's processes (bridge.transport.startup_timeout_s): 180 s, or the user's."""

from __future__ import annotations

import pytest

from bridge.errors import BridgeError
from bridge.transport import STARTUP_ENV, startup_timeout_s


def test_the_default_is_three_minutes() -> None:
    assert startup_timeout_s({}) == 180.0


def test_the_environment_sets_another_limit() -> None:
    assert startup_timeout_s({STARTUP_ENV: "900"}) == 900.0


@pytest.mark.parametrize("bad", ["0", "-5", "ten", "nan"])
def test_a_bad_value_is_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(BridgeError, match=STARTUP_ENV):
        startup_timeout_s({STARTUP_ENV: bad})
