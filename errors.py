"""Errors that the CLI turns into a one-line message and exit code 2."""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")


class BranchgateError(Exception):
    """A user-facing error: bad input, missing model, mismatched files. The message says what and where."""


class InputError(BranchgateError):
    """Bad input data; the message names the file and line or field."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        where = file if file is not None else ""
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}" if where else message)
        self.file, self.line, self.reason = file, line, message


class MismatchError(BranchgateError):
    """Two artefacts disagree (encoder, schema version, feature schema)."""


class LimitError(InputError):
    """A list or a number past one of the bounds in ``branchgate.limits``; the message names the field, the bound
    and its constant."""
