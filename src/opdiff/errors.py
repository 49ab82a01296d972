"""Errors a user can cause. The CLI prints their message on one line and exits with code 2."""


class OpdiffError(Exception):
    """Base class for every error caused by user input (paths, configs, dumps)."""


class ConfigError(OpdiffError):
    """An invalid PrecisionDebugger argument or config.json key."""


class DumpError(OpdiffError):
    """A dump that is missing, empty, corrupt or of an unknown format."""


class OverflowDetected(Exception):
    """Raised by task="overflow_check" once `overflow_nums` ops have created inf/NaN.

    Not an OpdiffError: it is a finding about the user's model, raised on purpose to stop
    training, and its message names the op, phase, step and source line.
    """


class StreamError(OpdiffError):
    """A monitor stream (written by opdiff.Monitor) that is missing, empty or corrupt."""
