"""Ctrl-C while a statement runs: a press that is never lost, for the API, the scripts and the shell."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable, Iterator, List

from ..records import Cancelled, cancelling


@contextlib.contextmanager
def interrupts(record: Callable[[int], None]) -> Iterator[None]:
    """Ctrl-C (SIGINT) calls ``record`` instead of raising KeyboardInterrupt (unless ``record``
    raises it), while in the block.
    A raised KeyboardInterrupt can be lost: when the handler runs inside a finalizer or a
    weakref callback of the main thread, Python prints it as ignored and goes on. Only the main
    thread can set a handler; elsewhere Python's own stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: record(signum))
    try:
        yield
    finally:
        # None: a handler set outside Python, which cannot be put back; Python's own instead
        signal.signal(signal.SIGINT, old if old is not None else signal.default_int_handler)


@contextlib.contextmanager
def ctrl_c_cancels(cancel: Callable[[], None]) -> Iterator[List[int]]:
    """While statements run in the main thread, Ctrl-C raises KeyboardInterrupt as ever and also
    calls ``cancel``, so that the work stops at its next model call or compile checkpoint even
    where the KeyboardInterrupt is lost (raised inside a finalizer or a weakref callback, which
    Python prints as ignored and goes on; here it is not printed, the press is kept). Yields the
    list of presses: a ``Cancelled`` that ends the block after a press is that Ctrl-C. Elsewhere
    (another thread, SIGINT ignored in a background job, or handled by the program that runs
    relmql, or by an outer block of this kind) nothing changes."""
    pressed: List[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield pressed
        return

    def press(signum: int) -> None:
        pressed.append(signum)
        cancel()
        raise KeyboardInterrupt

    def unraisable(u) -> None:
        if not (pressed and issubclass(u.exc_type, KeyboardInterrupt)):
            hook(u)
    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        with interrupts(press):
            yield pressed
    finally:
        sys.unraisablehook = hook


@contextlib.contextmanager
def interruptible(event: threading.Event) -> Iterator[None]:
    """The block's work stops at its next model call or compile checkpoint once ``event`` is set
    (``records.cancelling``); Ctrl-C sets it and raises KeyboardInterrupt, and a ``Cancelled`` that
    a press caused (its KeyboardInterrupt lost) is raised as KeyboardInterrupt."""
    with ctrl_c_cancels(event.set) as pressed, cancelling(event):
        try:
            yield
        except Cancelled:
            if pressed:
                raise KeyboardInterrupt from None
            raise
