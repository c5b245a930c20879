"""One exception type for every user-facing mistake: the CLI prints its message in one line, no traceback."""


class DraftTreeError(ValueError):
    """Bad input or a mismatch the user can fix (path, model, head, prompt, sampling parameter)."""
