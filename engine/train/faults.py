"""Fault injection inside the process that trains: fail exactly the way a real run does.

A fault (engine.vocabulary's grammar: `kind@step`, `kind@30s`, `+` for every attempt) fires at
the start of optimizer step `step` (0 = at start-up), or that long after the attempt started,
wherever the attempt is then: a long accumulation group or start-up included. Every failure is
the real thing: a real SIGABRT with nothing on stderr (the notes' silent Metal deaths), the real
message texts of MPS/CUDA/CPU out-of-memory and backend errors, the real "OMP: Error #15"
followed by an abort, a real hang that ignores SIGTERM, a loss that really turns NaN, gradients
really wrong (`wrong-grad`: what a backend's silent bug does), torch.compile's failure without
Triton (`compile-error`), steps that really take four times longer (`slow`, what swapping looks
like from the loop). So the supervisor classifies them from evidence alone, as it would a real
crash; nothing downstream knows a fault was injected except the `fault_injected` event, written
for the human reading.

The built-in trainer fires its faults with an Injector; a command's script fires those raised
in it through cockpit.report, with the same texts. The faults a supervisor delivers to a
command from outside (signals) are engine.run.faults'. Which attempts a fault fires in (once
a run, or `+` every attempt) is the supervisor's to say: it passes each attempt its faults.
`openmp` fires only when KMP_DUPLICATE_LIB_OK is not TRUE, as the real duplicate-runtime check
does. Torch-free at import.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from engine.vocabulary import SUPERVISOR_KINDS, Fault, parse

if TYPE_CHECKING:
    from engine.record.event_types import Emit

MPS_OOM = ("MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.23 GB, max "
           "allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool. Use "
           "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations "
           "(may cause system failure).")
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
            "of which 1.06 GiB is free. Of the allocated memory 75.31 GiB is allocated by PyTorch, "
            "and 1.52 GiB is reserved by PyTorch but unallocated.")
CPU_OOM = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
           "you tried to allocate 4294967296 bytes.")
METAL_ERROR = ("Error: command buffer exited with error status.\n"
               "\tThe Metal Performance Shaders operations encoded on it may not have completed.\n"
               "\tError: \n\t(null)\n\tInternal Error (0000000e:Internal Error)\n"
               "\t<AGXG14XFamilyCommandBuffer: 0x3a8e1c0f0>")
CUDA_ERROR = ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
              "asynchronously reported at some other API call, so the stacktrace below might be "
              "incorrect.")
OMP_ERROR = ("OMP: Error #15: Initializing libomp.dylib, but found libomp.dylib already initialized.\n"
             "OMP: Hint This means that multiple copies of the OpenMP runtime have been linked into "
             "the program. That is dangerous, since it can degrade performance or cause incorrect "
             "results. As an unsafe, unsupported, undocumented workaround you can set the environment "
             "variable KMP_DUPLICATE_LIB_OK=TRUE to allow the program to continue to execute.")

COMPILE_ERROR = ("backend='inductor' raised:\nRuntimeError: Cannot find a working triton installation. "
                 "Either the package is not installed or it is too old. More information on "
                 "installing Triton can be found at: https://github.com/triton-lang/triton\n\n"
                 "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially "
                 "if you're reporting a bug to PyTorch). For even more developer context, set "
                 "TORCH_LOGS=\"+dynamo\"")


class BackendCompilerFailed(RuntimeError):
    """Named as torch._dynamo.exc's, whose constructor differs between torch versions."""


def openmp_duplicate_allowed(env: dict[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get("KMP_DUPLICATE_LIB_OK", "")
    return value.strip().upper() in ("TRUE", "1", "YES")


# Where a launch says when its attempt started (time.time() of its attempt_started event): the
# trainer and a command's cockpit.report count a timed fault's seconds from it, as the
# supervisor does, so all three agree whichever process fires it.
STARTED_ENV = "COCKPIT_ATTEMPT_STARTED"


def attempt_started(env: dict[str, str] | None = None) -> float | None:
    try:
        return float((os.environ if env is None else env)[STARTED_ENV])
    except (KeyError, ValueError):
        return None


SPIKE = 50.0   # what a rehearsed spike multiplies its step's loss by
DIVERGE = 30.0  # what a rehearsed divergence multiplies the learning rate by, from its step on


class Injector:
    """Fires the attempt's faults: step faults at the start of their step, timed faults at the
    first check after their time (each step's start, and after each micro-batch)."""

    def __init__(self, specs: tuple[str, ...], device_type: str, emit: Emit):
        # the supervisor's own (preempt) are not the trainer's to fire
        parsed = [f for f in map(parse, specs) if f.kind not in SUPERVISOR_KINDS]
        self.faults = [f for f in parsed if not f.timed]
        self.timed = sorted((f for f in parsed if f.timed), key=lambda f: f.after_s or 0.0)
        # Outside a supervisor's launch (the probe, a test) the attempt starts now.
        self.started = attempt_started() or time.time()
        self.device_type = device_type
        self.emit = emit
        self.poison_loss = False  # set by a fired 'nan' fault: the loss is NaN from then on
        self.spiking = False      # set by a fired 'spike' fault: this step's loss is SPIKE times its own
        self.diverging = False    # set by a fired 'diverge' fault: the learning rate DIVERGE times its own
        self.wrong_grad = False   # set by a fired 'wrong-grad' fault: gradients wrong from then on
        self.slow_s: float | None = None  # set by a fired 'slow' fault: extra seconds per step
        self._last_call: float | None = None
        self._step_s = 0.0
        self._step = 0            # the step under way, for a timed fault's event

    def due(self, step: int) -> bool:
        """Whether a step fault fires as `step` begins (before_step fires those up to it)."""
        return any(f.step is not None and f.step <= step for f in self.faults)

    def before_step(self, step: int) -> None:
        """Fire every fault due at `step` (the optimizer step about to run; 0 = start-up)."""
        now = time.monotonic()
        if self._last_call is not None and self.slow_s is None:
            self._step_s = now - self._last_call  # the last healthy step's duration
        self._last_call = now
        self._step = step
        self.spiking = False      # a spike is one step's
        if self.slow_s is not None:
            time.sleep(self.slow_s)
        for fault in [f for f in self.faults if f.step is not None and f.step <= step]:
            self.faults.remove(fault)
            self._fire(fault, step=step)
        self.check_time()

    def check_time(self) -> None:
        """Fire the timed faults whose time has come (the trainer calls this after each
        micro-batch too, so a long accumulation group does not hold one back). Cheap when
        none is due: one clock read."""
        while self.timed and time.time() - self.started >= (self.timed[0].after_s or 0.0):
            fault = self.timed.pop(0)
            self._fire(fault, step=self._step, at_s=round(time.time() - self.started, 3))

    def _fire(self, fault: Fault, **where) -> None:
        if fault.kind == "openmp" and openmp_duplicate_allowed():
            return  # the real check lets the duplicate runtime through
        self.emit("fault_injected", spec=fault.spec, kind=fault.kind, **where)
        getattr(self, "_" + fault.kind.replace("-", "_"))()

    # Each is what the real failure does to the process.

    def _native_crash(self) -> None:
        _die(signal.SIGABRT)  # the notes' silent death: no message, no traceback

    def _oom(self) -> None:
        import torch

        if self.device_type == "cuda":
            raise torch.OutOfMemoryError(CUDA_OOM)
        # MPS raises a plain RuntimeError (MPSAllocator.mm); so does the CPU allocator.
        raise RuntimeError(MPS_OOM if self.device_type == "mps" else CPU_OOM)

    def _backend(self) -> None:
        if self.device_type == "cuda":
            raise RuntimeError(CUDA_ERROR)
        print(METAL_ERROR, file=sys.stderr, flush=True)
        _die(signal.SIGABRT)  # Metal's failed command buffer aborts the process

    def _openmp(self) -> None:
        print(OMP_ERROR, file=sys.stderr, flush=True)
        _die(signal.SIGABRT)  # libomp calls abort() after the hint

    def _nan(self) -> None:
        self.poison_loss = True

    def _spike(self) -> None:
        # A corrupted batch: one step's loss, and so its gradient, SPIKE times what it is; the
        # run goes on, finite, knocked off course (what a loss spike is: a number that stays
        # finite, which no crash ever shows).
        self.spiking = True

    def _diverge(self) -> None:
        # A learning rate far too high for the rest of the attempt (a schedule misread, a
        # warmup skipped): the run goes on, finite for a while, its eval loss climbing.
        self.diverging = True

    def _wrong_grad(self) -> None:
        # A backend that computes wrong gradients (pytorch #177116 on MPS): the trainer makes
        # one parameter's gradient a hundred times too big from here on; the parity check at
        # the start of an attempt (step 0) sees it on the candidate and not on the CPU.
        self.wrong_grad = True

    def _slow(self) -> None:
        # What swapping looks like from the loop: the same work, each step four times longer.
        self.slow_s = 3 * max(self._step_s, 0.01)

    def _hang(self) -> None:
        # A kernel that never returns: signals stay pending, so a SIGTERM goes unanswered and
        # only SIGKILL ends it — what a wedged Metal or CUDA call looks like from outside.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        while True:
            time.sleep(3600)

    def _compile_error(self) -> None:
        # What torch.compile raises at the first compiled forward pass on a machine with no
        # working Triton: Dynamo's wrapper around the backend's failure, its text verbatim.
        raise BackendCompilerFailed(COMPILE_ERROR)

    def _user_code(self) -> None:
        raise ValueError("too many values to unpack (expected 2, got 3) "
                         "[injected user-code fault]")


def _die(sig: signal.Signals) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(5)  # the signal is delivered before this returns
