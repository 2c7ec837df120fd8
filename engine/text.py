"""Text a program printed to a terminal, read back from its log: its escape sequences.

Ground floor: the output parser (engine.command.progress), the attempt log's views and crash
excerpts (engine.record.attempt_log, engine.run.crashes) and the front ends strip the same ones.
"""

from __future__ import annotations

import re

# Terminal escapes: CSI (colours, cursor moves), OSC (Rich's hyperlinks, window titles, ended by
# BEL or ST), character-set designations, keypad modes and the other two-byte ones.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]"
                  r"|\x1b[=>]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """`text` without terminal escapes (colour, cursor moves, hyperlinks)."""
    return ANSI.sub("", text) if "\x1b" in text else text
