"""Standard streams that a closed pipe cannot break.

``python train.py ... | tee log`` and Ctrl-C: the terminal sends SIGINT to the whole pipeline,
so ``tee`` is gone while training stops, and the next write to standard output fails with
``BrokenPipeError`` (Python ignores SIGPIPE). Each writer fails its own way: Lightning's progress
bar raises inside the training step (the run ends FAILED before the interrupt saves
``last.ckpt``), Rich (the model summary) turns it into ``SystemExit(1)``, the tokenizer's Rust code
panics, and the logging module prints a traceback per record. ``pipe_safe`` makes the run's
streams safe for the time of a run: ``sys.stdout`` and ``sys.stderr`` become ``PipeSafe`` proxies,
and every logging handler that wrote to them writes to the proxies. The first write that finds
the reader gone points the stream's file descriptor at ``os.devnull`` (``os.dup2``), so every later
write of any writer, Python or native, succeeds and goes nowhere: with no reader, there is no one
to read it. A pipe whose reader left before the run started is found at once (``reader_gone``).
"""

from __future__ import annotations

import io
import logging
import os
import select
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class PipeSafe:
    """``sys.stdout`` or ``sys.stderr`` whose writes cannot fail for a closed pipe: the first that
    does silences the stream (``silence``) and reports the text as written. Everything else
    (``fileno``, ``isatty``, ``encoding``, ...) is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self.silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self.silence()

    def _fd(self) -> int | None:
        try:
            return self._stream.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # a test's capture, a closed file
            return None

    def reader_gone(self) -> bool:
        """Whether the stream is a pipe whose reading end is closed (``poll`` reports an error on
        the writing end of such a pipe, without writing anything)."""
        fd = self._fd()
        if fd is None or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, 0)  # no event asked for: errors and hang-ups are always reported
        return any(events & select.POLLERR for _, events in poller.poll(0))

    def silence(self) -> None:
        """Point the stream's file descriptor at ``os.devnull``, for every writer of this process."""
        fd = self._fd()
        if fd is None:
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every logging handler that holds a stream (the root logger's and every named logger's; not
    the logging module's last resort, which reads ``sys.stderr`` when it writes)."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
            and not isinstance(getattr(type(h), "stream", None), property)]


def _point(handler: logging.StreamHandler, stream) -> None:
    """``handler`` writes to ``stream`` from now on (``setStream`` would flush the old one first,
    which may be the broken pipe)."""
    handler.acquire()
    try:
        handler.stream = stream
    finally:
        handler.release()


@contextmanager
def pipe_safe() -> Iterator[None]:
    """For the time of the block, ``sys.stdout``, ``sys.stderr`` and the logging handlers that
    write to them cannot fail for a closed pipe (``PipeSafe``); the streams found are put back at
    its end (a stream silenced meanwhile stays pointed at ``os.devnull``)."""
    found = (sys.stdout, sys.stderr)
    safe = tuple(s if s is None or isinstance(s, PipeSafe) else PipeSafe(s) for s in found)
    for s in safe:
        if s is not None and s.reader_gone():
            s.silence()
    moved = [(h, h.stream) for h in _stream_handlers() for s in found if s is not None and h.stream is s]
    sys.stdout, sys.stderr = safe
    for handler, stream in moved:
        _point(handler, safe[0] if stream is found[0] else safe[1])
    try:
        yield
    finally:
        if (sys.stdout, sys.stderr) == safe:
            sys.stdout, sys.stderr = found
        for handler, stream in moved:
            _point(handler, stream)
