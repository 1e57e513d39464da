"""User-facing errors.

Contract: anything the user can get wrong (a record, an override, a trace, an argument) raises UserError with one line
that names the file, JSON path or argument and what was expected. The CLI prints that line and exits with status 2;
no traceback is shown for a UserError.
"""


class UserError(Exception):
    """Bad input from the user; str(err) is the one line shown."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
