"""The byte-level text a trm (or lora) run learns from, split once into train and held-out.

Default: the .py sources of the running Python's standard library, which every machine with
Python has offline. Or the user's `data_path`:
    .txt     plain text; the last `eval_bytes` (at most a tenth of the file) are held out
    .jsonl   one conversation per line, {"messages": [{"role": ..., "content": ...}, ...]}
             (or {"text": ...}), rendered as
                 <|user|>\\nHello\\n<|assistant|>\\nHi there\\n<|end|>\\n
             so a prompt in that shape continues as the assistant.
Documents (stdlib files, conversations) are put in a fixed pseudo-random order that does not
depend on the run's seed, so every run holds out the same documents: the first ones in that
order fill the held-out text, the rest the training text, up to `corpus_bytes`.

Plain Python, no torch: cheap to test and to call from anywhere.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError

# Fixed, not the run's seed: the held-out set must be the same for every run to compare them.
_SPLIT_SEED = 20251218
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
ROLE_TEMPLATE = "<|{role}|>\n{content}\n"
END_OF_CONVERSATION = "<|end|>\n"


@dataclass(frozen=True)
class Corpus:
    train: bytes
    held_out: bytes
    source: str          # what it was made from, in words


def stdlib_dir() -> Path:
    # sysconfig's 'stdlib' is the base interpreter's library even inside a virtual env.
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted by relative path (site-packages excluded)."""
    root = root or stdlib_dir()
    found: list[Path] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        found.extend(Path(directory, f) for f in files if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _split_documents(docs, corpus_bytes: int, eval_bytes: int) -> tuple[bytes, bytes]:
    """docs: an iterable of zero-argument callables returning bytes, already in split order."""
    held, train = bytearray(), bytearray()
    for read in docs:
        if len(held) < eval_bytes:
            held += read()
        elif len(train) < corpus_bytes:
            train += read()
        else:
            break
    return bytes(train[:corpus_bytes]), bytes(held[:eval_bytes])


def _ordered(items: list) -> list:
    items = list(items)
    random.Random(_SPLIT_SEED).shuffle(items)
    return items


def _render(record: dict, where: str) -> str:
    if isinstance(record.get("text"), str):
        return record["text"] + "\n"
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ConfigError(where, None, "expected an object with \"messages\": [{\"role\": ..., "
                                       "\"content\": ...}, ...] or \"text\": \"...\"")
    parts = []
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise ConfigError(where, None, "each message must be {\"role\": string, "
                                           "\"content\": string}")
        parts.append(ROLE_TEMPLATE.format(role=m["role"], content=m["content"]))
    return "".join(parts) + END_OF_CONVERSATION


def _jsonl_documents(path: Path) -> list[bytes]:
    docs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(where, None, f"is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ConfigError(where, None, "expected a JSON object per line")
            docs.append(_render(record, where).encode("utf-8"))
    return docs


def load(data_path: str, corpus_bytes: int, eval_bytes: int, min_bytes: int,
         where: str = "params.data_path") -> Corpus:
    """The training and held-out bytes; each must hold at least `min_bytes` (one window)."""
    if not data_path:
        root = stdlib_dir()
        files = _ordered(stdlib_files(root))
        train, held = _split_documents((f.read_bytes for f in files), corpus_bytes, eval_bytes)
        source = f"the Python standard library's .py sources in {root}"
    else:
        path = Path(data_path).expanduser()
        if not path.is_file():
            raise ConfigError(where, None, f"{data_path!r} is not a file; expected a .txt or "
                                           ".jsonl file, or \"\" for the Python standard library")
        try:
            if path.suffix == ".jsonl":
                docs = _ordered(_jsonl_documents(path))
                train, held = _split_documents(((lambda d=d: d) for d in docs),
                                               corpus_bytes, eval_bytes)
                source = f"{len(docs)} conversations from {path}"
            else:
                text = path.read_bytes()
                # Split by position: the tail is held out, at most a tenth of the file.
                cut = len(text) - min(eval_bytes, len(text) // 10)
                train, held = text[:cut][:corpus_bytes], text[cut:]
                source = f"{path}"
        except UnicodeDecodeError as e:
            raise ConfigError(where, None, f"{data_path!r} is not UTF-8 ({e.reason})") from None
        except OSError as e:
            raise ConfigError(where, None, f"{data_path!r} cannot be read ({e.strerror})") from None
    for name, part in (("training", train), ("held-out", held)):
        if len(part) < min_bytes:
            raise ConfigError(where, None, f"the {name} text from {source} has {len(part)} bytes, "
                                           f"expected at least {min_bytes} (one window of "
                                           "seq_len + 1 bytes); use more text or a shorter seq_len")
    return Corpus(train=train, held_out=held, source=source)
