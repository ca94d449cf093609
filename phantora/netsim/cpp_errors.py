"""The text of a C++ exception that cppyy raised, for one-line errors (no ns-3 import: any netsim module may use it)."""

from __future__ import annotations


def cpp_message(exc: BaseException) -> str:
    """The what() text of a C++ exception raised through cppyy."""
    text = str(exc)
    if "=>" in text:
        text = text.split("=>", 1)[1].strip()
    for prefix in ("invalid_argument: ", "runtime_error: ", "out_of_range: ", "logic_error: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text
