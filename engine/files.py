"""Files cockpit writes and reads back: atomically, and TOML read with one clear error.

The ground floor under presets, the run directory, settings and the probe cache: none of
them needs another's rules to write a file that is never half-written, or to read a TOML file
a person wrote by hand and be told, in one line, what is wrong with it and where.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import tomllib
from pathlib import Path

import tomli_w

from engine.errors import ConfigError

MAX_TOML_BYTES = 1 << 20  # a preset or run.toml is a few hundred bytes; 1 MiB is only a mistake


def read_toml(path: Path) -> dict:
    """A preset or run.toml as a table. Every way the file can be unusable (unreadable, not a
    regular file, too big, not UTF-8, not TOML, nested past reason, empty) is one ConfigError;
    at most MAX_TOML_BYTES + 1 bytes are read, so a link to an endless file cannot exhaust memory."""
    where = str(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, /dev/zero never ends
            raise ConfigError(where, None, "is not a regular file; expected a TOML file")
        with open(path, "rb") as f:
            data = f.read(MAX_TOML_BYTES + 1)
    except OSError as e:
        raise ConfigError(where, None, f"cannot be read ({e.strerror})") from None
    if len(data) > MAX_TOML_BYTES:
        raise ConfigError(where, None, f"is larger than {MAX_TOML_BYTES >> 20} MiB; expected a "
                                       "TOML file of settings (a few hundred bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # the line and key a person can find in an editor; the offset for a hex dump
        number = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        lines = data.decode("utf-8", errors="replace").split("\n")
        raise ConfigError(f"{where}, line {number}", _key_at(lines, number),
                          f"is not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}, offset "
                          f"{e.start}: saved as Latin-1 or another legacy encoding?); expected TOML "
                          "saved as UTF-8") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise toml_error(where, text, str(e)) from None
    except RecursionError:
        number = _too_deep(text)
        raise ConfigError(f"{where}, line {number}", _key_at(text.split("\n"), number),
                          "nests tables or arrays too deeply to read; expected settings a few "
                          "levels deep") from None
    if not table:
        raise ConfigError(where, None, "has no settings; expected at least one key (an empty "
                                       "file would run on the defaults unseen)")
    return table


# What tomllib's messages mean for someone writing a preset by hand: (what is wrong, expected).
_TOML_HINTS = {
    "Cannot overwrite a value": ("set twice", "each key once"),
    "Cannot declare": ("a table declared twice", "each [table] once"),
    "Illegal character '\\n'": ("a string not closed on its line", "a closing quote"),
    "Unterminated string": ("a string never closed", "a closing quote"),
    "Expected \"'\"": ("a string never closed", "a closing quote"),
    "Invalid value": ("a value TOML cannot read",
                      "a number, true or false, a quoted string or a [list]"),
    "Expected '=' after a key": ("not key = value", "key = value"),
    "Expected newline or end of document after a statement": ("more after the value",
                                                              "one key = value a line"),
}
_TOML_WHERE = re.compile(r" \(at (?:line (\d+), column (\d+)|end of document)\)$")
_TOML_KEY = re.compile(r"""^\s*([A-Za-z0-9_.\-"' ]+?)\s*=\s*(.*)$""")
_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]")


# Brackets deeper than this are no one's settings; tomllib gives up (RecursionError) far later.
_DEEP = 64


def _too_deep(text: str) -> int:
    """The line where the brackets first nest past _DEEP (strings not told apart: a nesting
    this deep is rare enough that the line it starts on is what helps); the last line if never."""
    depth, number = 0, 1
    for char in text:
        if char == "\n":
            number += 1
        elif char in "[{":
            depth += 1
            if depth > _DEEP:
                return number
        elif char in "]}":
            depth = max(0, depth - 1)
    return number


def _key_at(lines: list[str], number: int) -> str | None:
    """The key a line sets or the value it is part of, dotted with its [table]: that of the
    nearest `key =` line at or above it; None above the first."""
    for i in range(min(number, len(lines)) - 1, -1, -1):
        if (header := _TOML_TABLE.match(lines[i])):
            return None   # the line is in a [table] before any key of it
        if (assignment := _TOML_KEY.match(lines[i])):
            key = assignment.group(1)
            table = next((m.group(1) for above in reversed(lines[:i]) if (m := _TOML_TABLE.match(above))), None)
            key = f"{table}.{key}" if table else key
            return re.sub(r"\s*\.\s*", ".", key.replace('"', "").replace("'", ""))
    return None


def toml_error(where: str, text: str, message: str) -> ConfigError:
    """A TOML syntax error as one line a person can act on: the file and line, the key on that
    line (dotted with its [table]), what is wrong in plain words, the line as written and
    tomllib's own words, which are only 'Cannot overwrite a value (at line 3, column 15)'. An
    error at the end of the document (a string or list never closed) is blamed on the last
    key = line: the statement that never ended."""
    found = _TOML_WHERE.search(message)
    parser = message[:found.start()] if found else message
    lines = [line.rstrip("\r") for line in text.split("\n")]   # tomllib counts lines by \n alone
    if found and found.group(1):
        number, column = int(found.group(1)), int(found.group(2))
    else:
        starts = [i + 1 for i, line in enumerate(lines) if _TOML_KEY.match(line)]
        number, column = (starts[-1] if starts else len(lines)), None
    line = lines[number - 1] if 0 < number <= len(lines) else ""
    key, value = None, ""
    if (header := _TOML_TABLE.match(line)):
        key = header.group(1)
    elif (assignment := _TOML_KEY.match(line)):
        key, value = assignment.group(1), assignment.group(2).strip()
        table = next((m.group(1) for above in reversed(lines[:number - 1])
                      if (m := _TOML_TABLE.match(above))), None)
        key = f"{table}.{key}" if table else key
    key = key and re.sub(r"\s*\.\s*", ".", key.replace('"', "").replace("'", ""))
    what, expected = next((h for start, h in _TOML_HINTS.items() if parser.startswith(start)),
                          (None, None))
    if parser.startswith("Invalid value"):
        if column is None:
            what, expected = "never finished", "the string, [list] or {table} closed"
        elif key and re.fullmatch(r"[A-Za-z][\w.-]*", value):   # device = cpu: a string without quotes
            expected = f'a quoted string ({key.rpartition(".")[2]} = "{value}")'
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line.strip())  # no escapes
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    problem = ("is" if key else "this line is") + " not valid TOML" + (f", {what}" if what else "") \
        + (f": {shown}" if shown else "")
    if expected:
        problem += f"; expected {expected}"
    said = parser + (f", column {column}" if column else "")
    return ConfigError(f"{where}, line {number}", key, f"{problem} (tomllib: {said})")


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def dump_toml(table: dict) -> bytes:
    return tomli_w.dumps(table).encode()
