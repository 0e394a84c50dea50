"""What can go wrong, as types: the command line turns each kind into its own exit status.

- ``InputError`` (exit 2): what the user gave cannot describe a real run: a config, a layout, a
  flag, a file. ``ConfigError`` and ``LayoutError`` are its two everyday kinds.
- ``MeasurementError`` (exit 2): the logs or the store the user pointed at do not hold what the
  step needs (no finished runs, units no run identifies); nothing measured is lost.
- ``RunFailure`` (exit 1): runs on the cluster failed, so a phase of the tune cannot go on.

A caller's bug is none of these: it stays a ``ValueError``/``TypeError`` and shows its traceback.
"""

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class RayLayoutError(Exception):
    """Every error ray_layout reports to its user in one line."""

    exit_code = EXIT_FAILURE


class InputError(RayLayoutError, ValueError):
    """Input that cannot describe a real Megatron run."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """A model or parallel configuration, a settings value or an input file that is unusable."""


class LayoutError(InputError):
    """A layout string or layout that Megatron would reject (or that we cannot use)."""


class MeasurementError(RayLayoutError):
    """Logs or stored measurements that cannot answer what was asked of them."""

    exit_code = EXIT_BAD_INPUT


class RunFailure(RayLayoutError):
    """Runs on the cluster failed and the step that needed them cannot go on."""
