"""Preemption: SIGTERM or Ctrl-C asks the run to stop at the next optimizer step, saved.

Clusters preempt a job with SIGTERM, then SIGKILL after a grace period. A rank that receives
SIGTERM or SIGINT only sets a flag here; the trainer adds the flag to the sums it all-reduces
once per optimizer step anyway (no extra collective), so every rank sees the same answer at the
same step boundary, saves one checkpoint with the others and returns; `specdraft train` then
exits with STOPPED_EXIT ("stopped, resumable": `--resume latest` continues exactly).

A second SIGTERM or SIGINT stops the process at once (exit 128 + signal, nothing saved), and so
does the deadline: a stop that has not finished within `stop_timeout` seconds of the first signal
(a rank stuck in a collective, a save slower than the cluster's grace) exits hard rather than
being killed mid-write. The built-in launcher forwards a stop to its ranks with SIGUSR1 (a
request, never counted as a second signal: a Ctrl-C reaches the ranks and the launcher alike) and
a hard stop with SIGUSR2.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)

# `specdraft train`'s exit status after a stop that saved a checkpoint (EX_TEMPFAIL: try again).
STOPPED_EXIT = 75
# Seconds from the first signal to a hard exit when the stop has not finished (--stop-timeout).
DEFAULT_STOP_TIMEOUT = 120.0
# Signals a user or a scheduler sends, and the launcher's forwarded request / hard stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
FORWARDED_STOP = signal.SIGUSR1
FORWARDED_KILL = signal.SIGUSR2


class _StopState:
    """What this process was asked (the one flag the trainer reads)."""

    def __init__(self) -> None:
        self.signal: int | None = None  # the first stop signal received
        self.received_at = 0.0
        self.count = 0  # stop signals counted towards "a second one stops at once"
        self.timeout = DEFAULT_STOP_TIMEOUT
        self.watchdog: threading.Timer | None = None


_STATE = _StopState()


def stop_requested() -> bool:
    """True once this process received a stop signal (SIGTERM, SIGINT or the launcher's)."""
    return _STATE.signal is not None


def stop_signal_name() -> str:
    """The name of the signal that asked for the stop ('' when none did)."""
    if _STATE.signal is None:
        return ""
    if _STATE.signal == FORWARDED_STOP:
        return "the launcher's stop request (SIGTERM or Ctrl-C)"
    return signal.Signals(_STATE.signal).name


def request_stop(signum: int = FORWARDED_STOP) -> None:
    """Ask for a stop at the next optimizer step (what the signal handler does; tests call it)."""
    if _STATE.signal is None:
        _STATE.signal = signum
        _STATE.received_at = time.monotonic()
        _arm_watchdog()


def hard_exit(signum: int) -> None:
    """Stop this process now: no save, exit status 128 + signal (flushes the log first)."""
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"specdraft: stopped at once by {signal.Signals(signum).name}; nothing saved since "
            "the last checkpoint (resume with --resume latest)\n"
        )
        sys.stderr.flush()
    os._exit(128 + int(signum))


def _on_signal(signum: int) -> None:
    """What a signal does (run by the listener thread, so it acts while the main thread waits
    inside a collective or a write)."""
    if signum == FORWARDED_KILL:
        hard_exit(signal.SIGTERM)
    if signum in STOP_SIGNALS:
        _STATE.count += 1
        if _STATE.count >= 2:
            hard_exit(signum)
    first = _STATE.signal is None
    request_stop(signum)
    if first:
        log.warning(
            "%s: stopping after the current optimizer step, with a checkpoint (a second "
            "signal stops at once, without saving; at most %.0f s)",
            stop_signal_name(),
            _STATE.timeout,
        )


def _python_handler(signum: int, frame: FrameType | None) -> None:
    """The main thread's handler does nothing: the listener thread reads the wakeup pipe."""


def _listen(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            _on_signal(signum)


def _arm_watchdog() -> None:
    timeout = _STATE.timeout
    if timeout <= 0 or _STATE.watchdog is not None:
        return

    def expire() -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"specdraft: the stop did not finish within {timeout:.0f} s (--stop-timeout)\n"
            )
        hard_exit(_STATE.signal or signal.SIGTERM)

    _STATE.watchdog = threading.Timer(timeout, expire)
    _STATE.watchdog.daemon = True
    _STATE.watchdog.start()


@contextlib.contextmanager
def stop_on_signals(timeout: float | None = None) -> Iterator[None]:
    """Within this block SIGTERM / SIGINT (and the launcher's SIGUSR1 / SIGUSR2) ask for a stop.

    Installed by a rank's entry point; the previous handlers come back afterwards. Outside the
    main thread (a library caller's worker thread) signals cannot be caught: nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _reset(DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
    signals = (*STOP_SIGNALS, FORWARDED_STOP, FORWARDED_KILL)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, _python_handler) for sig in signals}
    listener = threading.Thread(target=_listen, args=(read_fd,), name="stop-signals", daemon=True)
    listener.start()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)  # the listener reads EOF and ends
        listener.join(timeout=5)
        os.close(read_fd)
        _reset(_STATE.timeout)


def _reset(timeout: float) -> None:
    if _STATE.watchdog is not None:
        _STATE.watchdog.cancel()
    _STATE.__init__()  # type: ignore[misc]
    _STATE.timeout = timeout
