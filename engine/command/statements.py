"""What a command's own words state about its training: the total, epochs, accumulation, the
samples and tokens in a step.

A script says how long it trains and how many micro-batches make an optimizer step in its
argv (``--max_iters=200``, ``--num_train_epochs 3``, ``trainer.max_steps=300``) and in what
it prints (``Overriding: max_iters = 200``, the HF Trainer's ``Total train batch size (w.
parallel, distributed & accumulation) = 32``, nanoGPT's ``tokens per iteration will be:
491,520``, a config printed whole). This module reads both, and holds the names that say a
setting (never a metric) or a timing (never a metric either); engine.command.progress asks it
of each line it reads. Torch-free, stdlib only.

Fact keys: ``total`` (optimizer steps in the run), ``epochs``, ``accumulation``
(micro-batches per optimizer step), from the argv only ``batch_size`` (a micro-batch's
samples), and from printed lines only ``samples_per_step`` and ``tokens_per_step``.
"""

from __future__ import annotations

import re

# Names as normalised by `normalise`: lowercase, dashes to underscores, a dotted prefix
# (hydra's `trainer.max_steps`) dropped.
TOTAL_NAMES = frozenset(
    "max_iters max_iter max_iterations max_steps max_train_steps num_train_steps "
    "num_training_steps total_steps total_iters train_steps training_steps num_steps "
    "num_iters num_iterations n_steps n_iters steps iters max_update max_updates".split())
EPOCH_NAMES = frozenset(
    "epochs num_epochs num_train_epochs max_epochs max_epoch n_epochs nepochs "
    "train_epochs".split())
ACCUMULATION_NAMES = frozenset(
    "gradient_accumulation_steps gradient_accumulation grad_accum grad_accum_steps "
    "grad_accumulation_steps grad_acc grad_acc_steps accumulation accumulation_steps "
    "accum accum_steps accum_iter accumulate_grad_batches".split())

# A micro-batch's size as an argv names it: read from the argv only (a printed `batch_size = 12`
# states no fact: engine.command.units multiplies it by a stated accumulation, never alone,
# since a script may accumulate by default).
BATCH_NAMES = frozenset(
    "batch_size bs micro_batch_size micro_bs mbs per_device_train_batch_size "
    "per_gpu_train_batch_size train_batch_size train_micro_batch_size_per_gpu".split())

_FACT_OF = {**{n: "total" for n in TOTAL_NAMES}, **{n: "epochs" for n in EPOCH_NAMES},
            **{n: "accumulation" for n in ACCUMULATION_NAMES}}

# `200`, `600_000`, `3.0` (HF's examples write `--num_train_epochs 3.0`): a whole number
# as written, never an expression; a sign is not allowed, as -1 means "unset" (HF's max_steps).
_WHOLE = re.compile(r"(?P<digits>\d+(?:_\d+)*)(?:\.0+)?")


def normalise(name: str) -> str:
    """`--Max-Steps` -> `max_steps`; `+trainer.max_steps` -> `max_steps`."""
    name = name.strip().lstrip("-+").lower().replace("-", "_")
    return name.rsplit(".", 1)[-1]


def fact_of(name: str) -> str | None:
    """The fact key a setting's name states (`max_iters` -> "total"), else None."""
    return _FACT_OF.get(normalise(name))


def is_setting(name: str) -> bool:
    """Whether a name is a setting of the run (how long, how big a batch), which is never a
    metric: max_*, num_*, *_steps, *_iters, *_epochs, batch sizes, accumulation names
    (`num_input_tokens_seen`, a count of what the run has done, is not one)."""
    name = normalise(name)
    if name.endswith("_seen"):  # HF's num_input_tokens_seen: a count of the run, not a setting
        return False
    return (name in _FACT_OF or name.startswith(("max_", "num_"))
            or name.endswith(("_steps", "_iters", "_epochs", "_batches"))
            or name == "batch_size" or name.endswith("_batch_size"))


def is_timing(name: str) -> bool:
    """Whether a name is a figure of a run's speed that a framework logs beside its metrics
    (HF's eval_runtime, train_samples_per_second, total_flos), never a metric of the model."""
    name = normalise(name)
    return name == "total_flos" or name.endswith(("runtime", "_per_second"))


def whole_number(text: str) -> int | None:
    """A positive whole number as written (`200`, `600_000`, `3.0`), else None."""
    m = _WHOLE.fullmatch(str(text).strip())
    if not m:
        return None
    value = int(m["digits"].replace("_", ""))
    return value if value > 0 else None


def from_argv(argv: list[str]) -> dict[str, tuple[int, str]]:
    """The facts an argv (placeholders already filled) states, each with the words it came
    from: `["train.py", "--max_iters=200"]` -> `{"total": (200, "--max_iters=200")}`.

    Forms: `--name=value`, `--name value`, and `name=value` (nanoGPT's configurator, hydra's
    overrides, dotted or not). A later statement of a fact wins, as argparse's does. Never
    raises."""
    found: dict[str, tuple[int, str]] = {}
    try:
        words = [str(w) for w in argv]
    except Exception:
        return found
    for i, word in enumerate(words):
        if "=" in word:
            name, _, text = word.partition("=")
            said = word
        elif word.startswith("-") and i + 1 < len(words):
            name, text = word, words[i + 1]
            said = f"{word} {text}"
        else:
            continue
        if not name.strip("-+"):
            continue
        key = fact_of(name) or ("batch_size" if normalise(name) in BATCH_NAMES else None)
        value = whole_number(text) if key else None
        if key and value is not None:
            found[key] = (value, said)
    return found


# ---------------------------------------------------------------- what it prints

# Lines that state a unit or a total, whole messages (after a logging prefix).
_STATED = (
    (re.compile(r"tokens per iteration will be:\s*(?P<v>\d[\d,]*)", re.IGNORECASE),
     "tokens_per_step"),  # nanoGPT
    (re.compile(r"Total train batch size \(w\. parallel, distributed (?:&|and) accumulation\)"
                r"\s*=\s*(?P<v>\d[\d,]*)"), "samples_per_step"),  # the HF Trainer's, and below
    (re.compile(r"Total optimization steps\s*=\s*(?P<v>\d[\d,]*)"), "total"),
    (re.compile(r"Gradient Accumulation steps\s*=\s*(?P<v>\d[\d,]*)"), "accumulation"),
    (re.compile(r"Num Epochs\s*=\s*(?P<v>\d[\d,]*)"), "epochs"),
)
# nanoGPT's configurator: `Overriding: max_iters = 200`; a printed config line alone:
# `max_iters = 200`, `max_steps: 300`, `trainer.max_steps=300  # a comment`.
_OVERRIDING = re.compile(r"Overriding:\s*(?P<name>[\w.]+)\s*=\s*(?P<v>.*)")
_CONFIG_LINE = re.compile(r"(?P<name>[A-Za-z_][\w.\-]*)\s*[:=]\s*(?P<v>\d[\d,_]*(?:\.0+)?)\s*(?:#.*)?")
# A whole config printed on one line: `Namespace(max_steps=300, lr=0.001)` (argparse),
# `config: {'max_steps': 300, ...}`; its settings' values are whole numbers, unquoted.
_CONFIG_DUMP = re.compile(r"(?:[\w ]+:\s*)?(?:[\w.]*Namespace\((?P<body>.*)\)|\{(?P<dict>.*)\})")
_DUMPED = re.compile(r"['\"]?(?P<name>[A-Za-z_]\w*)['\"]?\s*[=:]\s*(?P<v>\d[\d_]*)(?=\s*[,)}]|\s*$)")
# `steps = 100` alone may be a count so far, not a setting: read from an argv only.
_BARE_AMBIGUOUS = frozenset(("steps", "iters"))
# Lightning, at the end: "`Trainer.fit` stopped: `max_steps=300` reached." (anywhere on a
# line: Rich draws it after a bar).
_FIT_STOPPED = re.compile(r"`Trainer\.fit` stopped: `(?P<name>\w+)=(?P<v>\d+)` reached")


def stated_in(message: str) -> dict[str, int] | None:
    """The facts one printed message states, whole (its logging prefix taken off): {} for a
    statement of no fact (nanoGPT's `Overriding: batch_size = 12`), None for a message that
    states nothing."""
    for pattern, key in _STATED:
        m = pattern.fullmatch(message)
        if m:
            return _facts({key: whole_number(m["v"].replace(",", ""))})
    m = _OVERRIDING.fullmatch(message)
    if m:  # nanoGPT's; a setting that is not a fact (batch_size) gives nothing
        return _facts({fact_of(m["name"]): whole_number(m["v"].strip())})
    m = _CONFIG_LINE.fullmatch(message)
    if m and fact_of(m["name"]) and m["name"].rsplit(".", 1)[-1].lower() not in _BARE_AMBIGUOUS:
        return _facts({fact_of(m["name"]): whole_number(m["v"].replace(",", ""))})
    return None


def dumped_in(message: str) -> dict[str, int]:
    """The facts of a config printed whole on one line (argparse's `Namespace(...)`, a dict)."""
    m = _CONFIG_DUMP.fullmatch(message)
    if not m:
        return {}
    body = m["body"] if m["body"] is not None else m["dict"]
    return _facts({fact_of(p["name"]): whole_number(p["v"]) for p in _DUMPED.finditer(body)})


def fit_stopped(line: str) -> tuple[str, dict[str, int]] | None:
    """Lightning's "`Trainer.fit` stopped: `max_steps=300` reached.", anywhere on the line:
    (what it said, its facts)."""
    m = _FIT_STOPPED.search(line)
    return (m[0] + ".", _facts({fact_of(m["name"]): int(m["v"])})) if m else None


def _facts(found: dict) -> dict[str, int]:
    return {k: v for k, v in found.items() if k is not None and v is not None}
