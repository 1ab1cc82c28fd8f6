"""The one exception for bad input, shared by the config and everything it reads."""


class UsageError(Exception):
    """Bad input from the user: reported as one clear message and exit status 2."""
