"""How an attempt ended, from evidence: exit status, signal, the log's tail and the events.

The supervisor gathers an `AttemptEnd` when an attempt's process is gone and `classify` turns it
into a `Verdict`: a kind, the evidence, and one sentence a user understands. Whose end it is (the
trainer's, a command's) is its launcher's `Subject`: the sentence's words and what its exit codes
mean; the rules themselves are the same for every launcher. Message patterns
come first (an MPS out-of-memory is a plain RuntimeError; a Metal command-buffer failure is a
SIGABRT with a message), then what the process died of. Torch-free; the crash kinds
themselves are engine.vocabulary's CrashKind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable

from engine.text import strip_ansi

# The words (crash kinds, the clean ends, the trainer's exit codes) are engine.vocabulary's.
from engine.vocabulary import (CLEAN, EXIT_CONFIG, EXIT_FINISHED, EXIT_NUMERICAL, EXIT_PARITY,
                               EXIT_STOPPED)

_OOM = re.compile(r"MPS backend out of memory|CUDA out of memory|OutOfMemoryError|"
                  r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|std::bad_alloc|"
                  r"Cannot allocate memory|out of memory|"
                  # MLX's Metal backend: the command buffer's, and a single buffer too large
                  r"Command buffer execution failed: Insufficient Memory|"
                  r"\[metal::malloc\] Attempting to allocate", re.IGNORECASE)
_OPENMP = re.compile(r"OMP: Error #15")
_BACKEND = re.compile(r"Placeholder storage has not been allocated on MPS device|"
                      r"command buffer exited with error status|MTLCommandBuffer|"
                      r"failed assertion|not currently implemented for the MPS device|"
                      r"MPSGraph|MPSNDArray|CUDA error|CUBLAS_STATUS_\w+|cuDNN error|"
                      r"NCCL error|device-side assert|"
                      r"\[METAL\] Command buffer execution failed")  # MLX's, any other cause
# A checkpoint that cannot be loaded (a torn write, bit rot): engine.record.checkpoint's
# Unreadable, from the trainer; torch.load's zip and unpickling errors, from a command -- but
# only about the checkpoint it was given to resume from (the same errors about the user's own
# data file or pretrained weights are a bug or a bad file of theirs: user-code).
_UNREADABLE = re.compile(r"^Unreadable: |checkpoint\.Unreadable\b")
_LOAD_FAILED = re.compile(r"PytorchStreamReader failed|failed finding central directory|"
                          r"Weights only load failed|UnpicklingError|invalid load key|BadZipFile|"
                          r"Bad CRC-32")
_TRACEBACK = "Traceback (most recent call last)"
# torch.compile failed: Dynamo could not trace, Inductor could not generate code, or there is no
# working Triton or C++ compiler here. The exception types torch raises, by name, and the line
# Dynamo wraps a backend's failure in. A bug of the workload's own that Dynamo meets while
# tracing can be wrapped the same way: then the eager attempt raises it plainly (user-code).
_COMPILE_ERRORS = ("BackendCompilerFailed", "InductorError", "TritonMissing", "InvalidCxxCompiler",
                   "CppCompileError", "InternalTorchDynamoError", "TorchRuntimeError", "Unsupported")
_COMPILE = re.compile(r"backend='\w+' raised|torch\._(?:dynamo|inductor)\.exc\.|"
                      r"Cannot find a working triton installation")
_PARITY = re.compile(r"computes wrong numbers")
# argparse's refusal (exit 2): a command's arguments, as the preset templated them, are wrong.
_USAGE = re.compile(r"^usage: .*$|: error: (?:unrecognized arguments|argument |the following arguments)"
                    r"|can't open file .*No such file or directory", re.MULTILINE)
_CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGTRAP")

SENTENCES = {
    "finished": "The attempt finished its schedule.",
    "stopped": "The attempt stopped when asked, after saving a checkpoint.",
    "config": "{subject} refused its configuration before training.",
    "oom": "The device ran out of memory{where}.",
    "backend": "The {backend} backend failed{where}; a different device or setting usually "
               "avoids it.",
    "native-crash": "{subject} died from {signal}{where} without a Python traceback: a native "
                    "crash{native}.",
    "openmp": "Two OpenMP runtimes were loaded into one process (torch and faiss); "
              "KMP_DUPLICATE_LIB_OK=TRUE lets it continue.",
    "numerical": "The loss became NaN or infinite{where}.",
    "numerical-parity": "The {device} computed wrong numbers in its parity check against the CPU "
                        "before training: a run on it would train garbage.",
    "compile": "torch.compile failed{where} ({exception}).",
    "hang": "{subject} made no progress for {timeout}{where} and was killed.",
    "killed": "{subject} was killed by {signal}{where} from outside (not a crash of its own).",
    "user-code": "{code_subject} raised {exception}{where}; falling back will not fix a bug.",
    "checkpoint": "A checkpoint could not be loaded{where} (a torn write or a damaged file), which "
                  "is not a bug in the workload.",
    "slowdown": "The run crawled{where} because memory was too full (swapping or under "
                "pressure); it checkpointed and stopped so the next preset can take over.",
    "unknown": "{subject} exited with code {code}{where} {unexplained}.",
}


# What a native crash is, on the device it happened on.
_NATIVE = {"mps": ", as Metal/MPS aborts are", "cuda": " in torch, a CUDA library or an extension"}


@dataclass(frozen=True)
class Subject:
    """Whose end is judged, as its launcher (engine.run.launchers) words it: who the sentence is
    about, what its exit codes mean (`exits`: the rules read before the shared ones), where its
    native crashes come from, whether a compile error is cockpit's setting or its own code, and
    how a checkpoint it could not load shows."""

    name: str                          # "The trainer": the sentence's subject
    code_name: str                     # "The workload code": who raised an exception
    unexplained: str                   # an unknown exit: "and left no explanation"
    native: str                        # where a native crash is when the device does not say
    silence: str                       # what a hang lacked: "event"
    compile_is_ours: bool              # its compile is a preset's setting (else its own code's)
    exits: Callable[[AttemptEnd, Callable[..., Verdict]], Verdict | None]
    unloadable: Callable[[AttemptEnd, str, int | None], str | None]


@dataclass(frozen=True)
class AttemptEnd:
    """Everything known about an attempt's process once it is gone."""

    exit_code: int | None               # when it exited
    signal: str | None                  # when a signal killed it ("SIGABRT")
    tail: str = ""                      # the end of attempt-N.log
    exception: dict | None = None       # the trainer's `exception` event, if it wrote one
    numerical: dict | None = None       # the trainer's `numerical` event, if it wrote one
    last_step: int | None = None        # the last step it reached (or reported)
    stop_requested: bool = False        # the user asked the run to stop
    hung_for_s: float | None = None     # set when the supervisor killed it for a hang
    compiling_hung_for_s: float | None = None  # ... a hang before the first step of a compiling trainer
    memory_percent: float | None = None  # system memory in use just before it died
    device: str | None = None           # the device it ran on (trainer_ready)
    slowdown: dict | None = None        # the warning for which the supervisor stopped it
    health: dict | None = None          # the health finding for which it ended it (a rewind)
    subject: Subject | None = None      # whose end (None: the built-in trainer's, TRAINER)
    resumed_from: str | None = None     # the checkpoint a command was given to resume from
    injected_crash: bool = False        # an injected native-crash it survived ended it (SIGKILL)


@dataclass(frozen=True)
class Verdict:
    kind: str
    sentence: str
    evidence: dict = field(default_factory=dict)

    @property
    def crashed(self) -> bool:
        return self.kind not in CLEAN


def _first_match(pattern: re.Pattern, *texts: str | None) -> str | None:
    for text in texts:
        for line in (text or "").splitlines():
            if pattern.search(line):
                return line.strip()
    return None


def classify(end: AttemptEnd, memory_limit_percent: float = 92.0) -> Verdict:
    # The evidence is read by people: Rich's tracebacks (Lightning's) colour it with escapes.
    end = replace(end, tail=strip_ansi(end.tail))
    subject = end.subject or TRAINER
    code, sig = end.exit_code, end.signal
    exc = end.exception or {}
    message = strip_ansi(f"{exc.get('error', '')}: {exc.get('message', '')}") if exc else ""
    evidence = {"exit_code": code, "signal": sig, "last_step": end.last_step}
    # The last step it reached (published each step, engine.record.reached), or, from a command
    # that publishes none, the last it reported: the crash came after it.
    where = f" after step {end.last_step}" if end.last_step else ""

    def verdict(kind: str, message: str | None = None, *, at: str | None = None, **words) -> Verdict:
        ev = {**evidence, **({"message": message} if message else {})}
        sentence = SENTENCES[kind].format(where=where if at is None else at, signal=sig, code=code,
                                          subject=subject.name, code_subject=subject.code_name,
                                          unexplained=subject.unexplained, **words)
        return Verdict(kind, sentence, ev)

    if end.health and not end.stop_requested:
        # ended by the supervisor, at once, to go back before what went bad: whatever its exit
        # says is the kill's (engine.run.rewind)
        return Verdict("health", f"The run went bad: {end.health.get('sentence')}.",
                       {**evidence, "health": end.health})
    if (said := subject.exits(end, verdict)) is not None:   # what its exit codes say
        return said
    if line := _first_match(_OPENMP, end.tail):
        return verdict("openmp", line)
    if end.hung_for_s is not None:
        return verdict("hang", f"no {subject.silence} for {end.hung_for_s:.0f} s",
                       timeout=f"{end.hung_for_s:.0f} s")
    if end.numerical:
        return numerical(end, verdict)
    if line := _first_match(_OOM, message, end.tail):
        return verdict("oom", line)
    if line := _first_match(_BACKEND, message, end.tail):
        backend = ("CUDA" if re.search(r"CUDA|CUBLAS|cuDNN|NCCL|device-side", line)
                   else "MLX/Metal" if "[METAL]" in line else "MPS/Metal")
        return verdict("backend", line, backend=backend)
    if line := subject.unloadable(end, message, code):
        return verdict("checkpoint", line)
    if end.compiling_hung_for_s is not None:
        # no step while compiling: the compile is what did not finish (eagerly, it would say
        # whether the device itself hangs)
        return verdict("compile", f"no step for {end.compiling_hung_for_s:.0f} s while compiling",
                       exception=f"no progress for {end.compiling_hung_for_s:.0f} s")
    if exc or (code is not None and _TRACEBACK in end.tail):
        raised = exc.get("error") or _raised(end.tail)
        # What ended it, not a warning printed on the way: the exception and its message, or
        # the last traceback's text. A command compiles as its own code says: no preset makes
        # its compile work, so its compile errors are its own (user-code).
        ending = message or end.tail.rsplit(_TRACEBACK, 1)[-1]
        if subject.compile_is_ours and (raised in _COMPILE_ERRORS or _first_match(_COMPILE, ending)):
            return verdict("compile", message or last_line(end.tail), exception=raised or "an error")
        return verdict("user-code", message or last_line(end.tail),
                       exception=raised or "an exception")
    if sig == "SIGKILL" and end.memory_percent is not None and end.memory_percent >= memory_limit_percent:
        return Verdict("oom", f"{subject.name} was killed by SIGKILL{where} with system memory "
                              f"{end.memory_percent:.0f}% full: the kernel's out-of-memory killer.",
                       {**evidence, "memory_percent": end.memory_percent})
    if sig in _CRASH_SIGNALS:
        return verdict("native-crash", last_line(end.tail) or None,
                       native=_NATIVE.get((end.device or "").partition(":")[0], subject.native))
    if sig:
        return verdict("killed")
    return verdict("unknown", last_line(end.tail) or None)


def numerical(end: AttemptEnd, verdict: Callable[..., Verdict]) -> Verdict:
    """The loss went non-finite: at the step it went bad, where that is known."""
    num = end.numerical or {}
    return verdict("numerical", num.get("message"),
                   at=f" at step {num['step']}" if num.get("step") is not None else None)


def _trainer_exits(end: AttemptEnd, verdict: Callable[..., Verdict]) -> Verdict | None:
    """The built-in trainer's exit codes are engine.vocabulary's, on purpose."""
    code, sig = end.exit_code, end.signal
    if code == EXIT_FINISHED:
        return verdict("finished")
    if end.slowdown and not end.stop_requested and code == EXIT_STOPPED:
        return verdict("slowdown", end.slowdown.get("message"))
    if code == EXIT_STOPPED or (end.stop_requested and sig):
        return verdict("stopped")  # a second stop request kills without a checkpoint
    if code == EXIT_CONFIG:
        return verdict("config", last_line(end.tail) or None)
    if end.hung_for_s is not None or _first_match(_OPENMP, end.tail):
        return None   # the shared rules: a hang or a duplicate OpenMP runtime, whatever the code
    if code == EXIT_PARITY:
        return verdict("numerical-parity", _first_match(_PARITY, end.tail) or None,
                       device=(end.device or "device").partition(":")[0].upper().replace("CUDA", "CUDA GPU"))
    if code == EXIT_NUMERICAL:
        return numerical(end, verdict)
    return None


def _command_exits(end: AttemptEnd, verdict: Callable[..., Verdict]) -> Verdict | None:
    """A command's exit codes are its own: what the supervisor did to it says more."""
    code = end.exit_code
    if end.numerical:
        return numerical(end, verdict)
    if end.slowdown and not end.stop_requested:
        return verdict("slowdown", end.slowdown.get("message"))
    if end.stop_requested:
        return verdict("stopped")   # however it exits: a script may save and exit 0 on Ctrl-C
    if end.injected_crash:
        # the rehearsal's, though SIGKILL had to finish it
        return verdict("native-crash", "the injected SIGABRT was caught; SIGKILL ended it",
                       native=" (rehearsed: --inject native-crash)")
    if code == 0:
        return verdict("finished")
    if code == 2 and _USAGE.search(end.tail or ""):
        return Verdict("config", "The command refused its arguments (as the presets filled them in).",
                       {"exit_code": code, "signal": end.signal, "last_step": end.last_step,
                        "message": last_line(end.tail)})
    return None


def _trainer_unloadable(end: AttemptEnd, message: str | None, code: int | None) -> str | None:
    """The trainer says so itself: engine.record.checkpoint's Unreadable."""
    return _first_match(_UNREADABLE, message, end.tail if code is not None else "")


def _command_unloadable(end: AttemptEnd, message: str | None, code: int | None) -> str | None:
    """Resumed and failed to load something before its first step: the same data and weights
    loaded in the attempt before, so it is the checkpoint it was given."""
    if end.resumed_from is None or end.last_step is not None:
        return None  # nothing to resume from, or it trained: the checkpoint loaded
    return _first_match(_LOAD_FAILED, message, end.tail if code is not None else "")


TRAINER = Subject(name="The trainer", code_name="The workload code",
                  unexplained="and left no explanation", native=" in torch or a native library it loaded",
                  silence="event", compile_is_ours=True, exits=_trainer_exits,
                  unloadable=_trainer_unloadable)
# A command's native crash need not be torch's (MLX); its compile is its own code's.
COMMAND = Subject(name="The command", code_name="The command",
                  unexplained="with no traceback or error message cockpit knows",
                  native=" in a native library it loaded", silence="output or event",
                  compile_is_ours=False, exits=_command_exits, unloadable=_command_unloadable)


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):")
# One rank's entry in the report, the root cause's and each of the other failures' alike.
_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n[^\n]*exitcode\s*:\s*(-?\d+)")


def torchrun_root_cause(tail: str) -> tuple[int, int] | None:
    """(rank, exit code — negative: a signal) of the rank whose end the others' followed, from
    torchrun's ChildFailedError report; None when the text has no such report. The other ranks'
    errors ("Connection reset by peer" in a collective) are consequences of that one. A rank a
    signal ended (killed, aborted) is that one wherever the report lists it: torchrun's "first
    observed failure" is the first it saw exit, and a peer whose collective broke can exit at
    once, before the agent sees the killed rank."""
    tail = tail or ""
    root = _ROOT_CAUSE.search(tail)
    first = _FAILURE.search(tail, root.end()) if root else None
    if root is None or first is None:
        return None
    listed = tail.rfind("Failures:", 0, root.start())
    entries = [(int(r), int(c)) for r, c in _FAILURE.findall(tail, listed if listed >= 0 else root.start())]
    return next((entry for entry in entries if entry[1] < 0), (int(first[1]), int(first[2])))


_BOX = "│╭╰┃┏┗"


def _raised(tail: str) -> str | None:
    """The exception type of the last Python traceback in a log tail ('ValueError')."""
    after = (tail or "").rsplit(_TRACEBACK, 1)
    if len(after) < 2:
        return None
    for line in after[1].splitlines()[1:]:  # past the header's own line
        # Rich's traceback (Lightning's) draws its frames in a box: the exception follows it
        if line and not line[0].isspace() and line[0] not in _BOX:
            match = re.match(r"([A-Za-z_][\w.]*)(?::|$)", line)
            return match.group(1).rsplit(".", 1)[-1] if match else None
    return None


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""
