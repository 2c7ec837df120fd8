"""An attempt's log (attempt-N.log): its child's stdout and stderr, as written.

The supervisor and the probe read it two ways: the tail, as evidence of how an attempt ended
(engine.run.crashes), and as it grows, for a command's progress and as a sign of life.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

TAIL_LINES = 40
OUTPUT_CHUNK = 1 << 20   # bytes of output read per call, at most


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines (of at most the last 16 KiB), decoded leniently."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class OutputFollower:
    """Reads what was appended to an attempt's log since the last call, as text (a UTF-8
    sequence split between two reads is decoded whole), and, given a parser
    (engine.command.progress.OutputParser), as the progress it says."""

    def __init__(self, path: Path, parser=None):
        self.path = path
        self.parser = parser
        self.offset = 0
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
        except OSError:
            return ""
        self.offset += len(data)
        return self._decoder.decode(data) if data else ""
