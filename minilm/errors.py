"""The one exception type for bad input.

Library code raises ``MinilmError`` (or a subclass) with a message that says what was wrong, where (config key,
file, line) and what is allowed. The CLIs catch it, print the message and exit with code 2; only ``--debug``
shows a traceback. Library code never calls ``sys.exit``.
"""


class MinilmError(Exception):
    """Bad input a user can fix: the message is the whole explanation."""


class ConfigError(MinilmError):
    """A config key, type or value is wrong; the message names the key and the file."""


class DataError(MinilmError):
    """A data source, tokenizer or cache problem; the message names the source and what to change."""
