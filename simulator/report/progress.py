"""Progress on stderr that suits where stderr goes: tqdm's bar, redrawn in place with
``\\r``, on a terminal; plain lines, one per tenth of the work, anywhere else, so a log or a
CI job's output keeps a dozen readable lines instead of thousands of redraws."""

from __future__ import annotations

import sys
import time

__all__ = ["LineProgress", "progress_bar", "progress_iter", "is_terminal"]


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class LineProgress:
    """The part of tqdm's interface sweeps and searches use (``update``, ``set_postfix``,
    ``close``), written as one line per tenth of ``total`` and one at the end.

    >>> import io
    >>> out = io.StringIO()
    >>> bar = LineProgress(20, "simulate", "pt", stream=out, clock=lambda: 0.0)
    >>> for _ in range(20):
    ...     bar.update(1)
    >>> bar.close()
    >>> lines = out.getvalue().splitlines()
    >>> len(lines), lines[0], lines[-1]
    (10, 'simulate: 2/20 pt (10%), 0s elapsed, ~0s left', 'simulate: 20/20 pt (100%), 0s elapsed')
    """

    def __init__(self, total: int, desc: str, unit: str, initial: int = 0, stream=None, clock=time.perf_counter):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self._clock, self._t0 = clock, clock()
        self._shown = initial * 10 // total if total > 0 else 0
        self._postfix = ""
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.total > 0 and self.n * 10 // self.total > self._shown:
            self._shown = self.n * 10 // self.total
            self._write()

    def set_postfix(self, refresh: bool = True, **kw) -> None:     # noqa: ARG002 (tqdm's signature)
        """Shown from the next line on."""
        self._postfix = ", ".join(f"{k} {v}" for k, v in kw.items())

    def close(self) -> None:
        if not self._closed and self.total > 0 and self._shown < 10:
            self._write()
        self._closed = True

    def _write(self) -> None:
        elapsed = self._clock() - self._t0
        done = self.n >= self.total
        left = "" if done or not self.n else f", ~{_clock(elapsed / self.n * (self.total - self.n))} left"
        extra = f", {self._postfix}" if self._postfix else ""
        self.stream.write(f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n // self.total}%), "
                          f"{_clock(elapsed)} elapsed{left}{extra}\n")
        self.stream.flush()


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, stream=None):
    """tqdm on a terminal, :class:`LineProgress` elsewhere."""
    stream = stream if stream is not None else sys.stderr
    if is_terminal(stream):
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream, dynamic_ncols=True)
    return LineProgress(total, desc, unit, initial=initial, stream=stream)


def progress_iter(items, desc: str, unit: str, stream=None):
    """``items`` (a sized collection), yielded while a :func:`progress_bar` counts them."""
    bar = progress_bar(len(items), desc, unit, stream=stream)
    try:
        for x in items:
            yield x
            bar.update(1)
    finally:
        bar.close()


def _clock(seconds: float) -> str:
    """``75.2`` -> ``1m15s``."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"
