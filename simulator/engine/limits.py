"""A wall-clock limit on one run, in whatever thread runs it.

:func:`time_limit` stops the run in the calling thread once ``seconds`` have passed, by two
routes, because either alone can miss:

* **Cooperatively.**  The engine's event loop asks :func:`check` every few thousand events
  and raises :class:`TimeLimitExceeded` once the limit has fired.  This is where nearly all of
  a long run's time goes, and it cannot be swallowed.
* **Asynchronously.**  A timer thread also sets :class:`TimeLimitExceeded` as an asynchronous
  exception on the running thread (CPython's ``PyThreadState_SetAsyncExc``), so that a run
  stuck outside the event loop (building or folding a very large program) stops too.  Such an
  exception lands at the thread's next bytecode, wherever that is; if that happens to be a
  callback whose errors Python reports and drops (a ``gc`` callback, a ``__del__``), it is
  lost, and the cooperative route then stops the run at the next check.  Python would report
  such a lost exception through ``sys.unraisablehook`` (pytest turns that into a warning);
  while a limit is armed the hook drops :class:`TimeLimitExceeded`, which is expected there,
  and passes anything else on.

Unlike SIGALRM both work in any thread: a local worker process and a Dask worker's task
thread alike.  Each :func:`time_limit` has its own token, so a limit that fired never leaks
into a later run on the same thread, and an asynchronous exception set but not yet delivered
when the run ends is cleared.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import threading

__all__ = ["TimeLimitExceeded", "time_limit", "check", "armed"]


class TimeLimitExceeded(BaseException):
    """The run outlived its wall-clock limit.  A BaseException, as KeyboardInterrupt is, so
    that no ``except Exception`` on the way swallows it."""


class _Token:
    __slots__ = ("fired", "live")

    def __init__(self):
        self.fired = False
        self.live = True


_TOKENS: dict[int, _Token] = {}          # thread ident -> the limit armed on that thread
_LOCK = threading.Lock()
_HOOK: list = []                         # the unraisable hook :func:`_quiet_hook` replaced, while armed


def _quiet_hook(unraisable) -> None:
    """``sys.unraisablehook`` while a limit is armed: an asynchronous :class:`TimeLimitExceeded`
    that landed in a callback whose errors Python drops is expected (the cooperative check stops
    the run); anything else goes to the hook this one replaced."""
    if isinstance(unraisable.exc_value, TimeLimitExceeded) or unraisable.exc_type is TimeLimitExceeded:
        return
    (_HOOK[0] if _HOOK else sys.__unraisablehook__)(unraisable)


def _hook_on() -> None:
    # (under _LOCK) the first armed limit installs the quiet hook
    if not _TOKENS:
        _HOOK[:] = [sys.unraisablehook]
        sys.unraisablehook = _quiet_hook


def _hook_off() -> None:
    # (under _LOCK) the last one puts back the hook it found, unless someone replaced ours since
    if not _TOKENS and _HOOK:
        if sys.unraisablehook is _quiet_hook:
            sys.unraisablehook = _HOOK[0]
        _HOOK.clear()


def _raise_async(tid: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(TimeLimitExceeded))


def _clear_async(tid: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


def armed() -> bool:
    """Whether a limit is armed on this thread (the engine then checks it as it goes)."""
    return threading.get_ident() in _TOKENS


def check() -> None:
    """Raise :class:`TimeLimitExceeded` if this thread's limit has fired."""
    tok = _TOKENS.get(threading.get_ident())
    if tok is not None and tok.fired:
        raise TimeLimitExceeded


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Stop the body with :class:`TimeLimitExceeded` once ``seconds`` have passed (no limit
    for None or 0)."""
    if not seconds:
        yield
        return
    tid = threading.get_ident()
    tok = _Token()

    def fire():
        with _LOCK:
            if tok.live:
                tok.fired = True
                _raise_async(tid)

    with _LOCK:
        _hook_on()
        outer = _TOKENS.get(tid)
        _TOKENS[tid] = tok
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with _LOCK:
            tok.live = False
            if outer is None:
                _TOKENS.pop(tid, None)
            else:
                _TOKENS[tid] = outer
            _hook_off()
        timer.cancel()
        if tok.fired:
            _clear_async(tid)
