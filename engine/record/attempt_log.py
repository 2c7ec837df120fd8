"""An attempt's log (attempt-N.log): its child's stdout and stderr, as written.

The supervisor and the probe read it two ways: the tail, as evidence of how an attempt ended
(engine.run.crashes), and as it grows, for a command's progress and as a sign of life. The log
view reads it as lines to show (LogLines): its tail, then what is appended, as a terminal would
have left it (tqdm's carriage-return redraws folded, colour codes dropped).
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path

from engine.text import ANSI, strip_ansi

TAIL_LINES = 40
OUTPUT_CHUNK = 1 << 20   # bytes of output read per call, at most


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines (of at most the last 16 KiB), decoded leniently, without terminal
    escapes: the evidence of a crash that people read (a crash's excerpt, attempt_ended's tail),
    and Rich's coloured tracebacks (Lightning's) would carry them raw. The log on disk stays as
    the script wrote it."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(strip_ansi(data.decode(errors="replace")).splitlines()[-lines:])


class OutputFollower:
    """Reads what was appended to an attempt's log since the last call, as text (a UTF-8
    sequence split between two reads is decoded whole), and, given a parser
    (engine.command.progress.OutputParser), as the progress it says."""

    def __init__(self, path: Path, parser=None):
        self.path = path
        self.parser = parser
        self.offset = 0
        self.written_by: float | None = None   # the log's mtime at the last read (time.time())
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def observe(self, to_end: bool = False) -> tuple[bool, list]:
        """(whether anything was written, the progress observations in it). `to_end`: the
        process is gone, so read the rest of the log and the parser's last partial line."""
        text = self.read()
        while to_end and (more := self.read()):
            text += more
        if self.parser is None:
            return bool(text), []
        observations = self.parser.feed(text) if text else []
        if to_end:
            observations += self.parser.flush()
        return bool(text), observations

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(OUTPUT_CHUNK)
                # what was read was written by then: a loaded supervisor reads a step a poll or
                # more after it was printed, and a checkpoint written between the two is after it
                self.written_by = os.fstat(f.fileno()).st_mtime
        except OSError:
            return ""
        self.offset += len(data)
        return self._decoder.decode(data) if data else ""


# ---------------------------------------------------------------- reading it as lines to show

TAIL_BYTES = 4 << 20        # what a log view starts from: the last 4 MiB, however big the log
PARTIAL_CHARS = 1 << 16  # of an unfinished line, kept at most
TRACEBACK = "Traceback (most recent call last):"
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def display_line(raw: str) -> str:
    """A line as a terminal left it: what follows its last carriage return (tqdm redraws its bar
    in place with \\r, so a log of hours is a few lines of final bars, not millions of frames),
    without colour codes or other control characters, tabs expanded."""
    raw = raw.rstrip("\r")
    if "\r" in raw:
        raw = raw.rsplit("\r", 1)[1]
    if "\x1b" in raw:
        raw = ANSI.sub("", raw)
    return _CONTROLS.sub("", raw).expandtabs()


class LogLines:
    """An attempt log read as display lines: first its tail (at most `tail_bytes`, from the first
    line that starts inside it), then, call by call, only what was appended. Logs of hundreds of
    megabytes cost one seek and `tail_bytes` of reading, never the whole file."""

    def __init__(self, path: Path, tail_bytes: int = TAIL_BYTES, chunk: int = OUTPUT_CHUNK):
        self.path = Path(path)
        self.tail_bytes = tail_bytes
        self.chunk = chunk
        self.offset: int | None = None   # where the next read starts; None: not opened yet
        self.skipped = 0                 # bytes before the tail, never read
        self.partial = ""                # the unfinished last line (a tqdm bar mid-redraw)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> tuple[list[str], bool]:
        """(the lines completed since the last call, whether they replace what was read before:
        the first call, a log that shrank (started over), or one that grew by more than
        `tail_bytes` since the last call, which is read from its new tail rather than chased)."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                offset = self.offset
                reset = offset is None or size < offset or size - offset > self.tail_bytes
                if offset is None or reset:
                    offset = self._start(f, size)
                f.seek(offset)
                data = f.read(size - offset)
        except OSError:
            return [], False
        self.offset = offset + len(data)
        lines = (self.partial + self._decoder.decode(data)).split("\n")
        self.partial = lines.pop()
        if len(self.partial) > PARTIAL_CHARS:  # a bar redrawn with \r for an hour, never ended
            self.partial = display_line(self.partial)[-PARTIAL_CHARS:]
        return [display_line(line) for line in lines], reset

    def _start(self, f, size: int) -> int:
        """Read from the tail (the whole log, when it is short): the offset to read from."""
        self.partial = ""
        self._decoder.reset()
        start = max(0, size - self.tail_bytes)
        if start:
            f.seek(start - 1)
            block = f.read(min(size - start + 1, 1 << 16))
            newline = block.find(b"\n")
            # from the first whole line: a line cut in half would read as nonsense
            start += newline if newline >= 0 else len(block) - 1
        self.offset = self.skipped = start
        return start

    def shown_partial(self) -> str:
        """The unfinished last line as shown, '' when there is none."""
        return display_line(self.partial)


def last_traceback(lines: list[str]) -> int | None:
    """Index of the line starting the last Python traceback in `lines`, or None."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith(TRACEBACK):
            return i
    return None


def logged_attempts(run_path: Path) -> list[int]:
    """The attempt numbers that have an attempt-N.log in the run directory, in order."""
    numbers = (p.stem.removeprefix("attempt-") for p in Path(run_path).glob("attempt-*.log"))
    return sorted(int(n) for n in numbers if n.isdigit())
