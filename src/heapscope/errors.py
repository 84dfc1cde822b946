"""Domain errors: each carries a one-line message and the exit code the CLI uses."""

from __future__ import annotations


class HeapscopeError(Exception):
    """A problem the user can act on, reported as one line with no traceback."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(HeapscopeError):
    """The command line asks for something impossible or contradictory."""

    exit_code = 2


class InputError(HeapscopeError):
    """A file the user gave is missing, unreadable or not in a format we read."""

    exit_code = 3

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[type[InputError], tuple[str, str]]:
        # Pickled between worker processes (parallel scans): rebuilt from its two parts.
        return (InputError, (self.path, self.problem))


class ToolError(HeapscopeError):
    """An external tool heapscope needs (symbolizer, debugger) is missing or failed."""

    exit_code = 4
