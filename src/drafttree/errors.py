"""One exception type for every user-facing mistake: the CLI prints its message in one line, no traceback."""


class DraftTreeError(ValueError):
    """Bad input or a mismatch the user can fix (path, model, head, prompt, sampling parameter)."""


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts such as ``--threads``: argparse prints the message as a usage error."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number > 0, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {n}")
    return n
