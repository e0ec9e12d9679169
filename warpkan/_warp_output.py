"""Warp's console output under warpkan: quiet unless asked for.

At its default ``wp.config.log_level`` (``wp.LOG_INFO``), warp-lang 1.19 prints a banner when its runtime
starts and a "Module ... load on device ... took ..." line for every module it loads, which would run into
progress bars and tables. (Older releases had ``wp.config.quiet``; 1.19 does not read it.) On a machine
without an NVIDIA driver, Warp's native library also writes "Warp CUDA warning: Could not find or load the
NVIDIA CUDA driver" to the process's stderr when the runtime starts, at any log level.

So ``import warpkan`` raises Warp's level to ``wp.LOG_WARNING`` (warnings and errors still show) unless the
program has chosen a level of its own, and warpkan starts the runtime with :func:`start_warp`, which drops
that one driver line and passes anything else written meanwhile through. The Warp-native layers, the
``@wp.func`` building blocks and the torch bridge start it when they are imported.

``WARPKAN_VERBOSE=1`` in the environment, or ``--verbose`` on the ``warpkan`` command, leaves Warp's output
as Warp makes it.
"""

from __future__ import annotations

import os
import sys
import tempfile

VERBOSE_ENV = "WARPKAN_VERBOSE"
_NO_DRIVER_LINE = b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"

_verbose = os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
_started = False


def _apply_level() -> None:
    import warp as wp

    if _verbose:
        if wp.config.log_level > wp.LOG_INFO:
            wp.config.log_level = wp.LOG_INFO
    elif wp.config.log_level == wp.LOG_INFO:  # Warp's default, so not the program's choice
        wp.config.log_level = wp.LOG_WARNING


def is_verbose() -> bool:
    """Whether Warp's banner and module-load lines are shown (``WARPKAN_VERBOSE``, :func:`set_verbose`)."""
    return _verbose


def set_verbose(verbose: bool) -> None:
    """Show (True) or hide (False) Warp's banner and module-load lines from now on, as ``WARPKAN_VERBOSE``
    does at start-up."""
    global _verbose
    _verbose = bool(verbose)
    _apply_level()


def start_warp() -> None:
    """``wp.init()``; unless verbose, without the native no-driver line (see the module's docstring)."""
    global _started
    if _started:
        return
    import warp as wp

    _started = True
    if _verbose:
        wp.init()
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr descriptor: nothing to filter
        wp.init()
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            wp.init()
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        written = held.read()
    kept = b"".join(line for line in written.splitlines(keepends=True) if not line.startswith(_NO_DRIVER_LINE))
    if kept:
        os.write(2, kept)


_apply_level()
