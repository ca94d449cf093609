"""User-facing errors: each names the file, line or field that is wrong."""

from __future__ import annotations


class PhantoraError(Exception):
    """Base class of every error phantora reports to a user without a traceback."""


class InputError(PhantoraError):
    """Bad user input: a file, a line in it, or a named field."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        where = ""
        if file is not None:
            where = str(file)
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            where += f"field '{field}': "
        super().__init__(where + message)


class SimulationInterruptedError(PhantoraError):
    """A signal (SIGTERM, SIGINT) stopped a simulator part-way through a run call; its handler did not raise."""


class PhantomValueError(PhantoraError):
    """A data-dependent value was asked for in phantom mode, where tensors have no values."""


class InputWarning(UserWarning):
    """Input that phantora accepts but partly ignores (the command line prints it as a warning line)."""
