"""A process cockpit starts in a session of its own, and every way it signals or ends one.

An attempt, a probe's worker and a notify command each run in a session of their own: a Ctrl-C in
the terminal reaches only cockpit, which decides what to forward, and the whole process group (a
script and its DataLoader workers) can be signalled at once. torchrun starts every worker with
start_new_session, so its workers leave the group: `signal_group` finds them as the leader's
descendants. This is the one place a group is signalled; the supervisor, the lifeline, the probe
and the notify command all come here.

Stopping an attempt is an escalation through its launch's stop signals (engine.run.launch). The
built-in trainer gets SIGTERM (finish the step, checkpoint, exit), a second SIGTERM (now), then
SIGKILL; a command gets what Ctrl-C in a terminal gives it (SIGINT to its process group), then
SIGTERM and SIGKILL, each after its preset's grace period. The supervisor steps through it from
its loop, a request at a time (`send_stop`, `stop_overdue`); the lifeline, whose supervisor is
gone, all at once (`stop`). A hang gets SIGTERM, then SIGKILL (`end_hung`).

Waiting for an exit wakes when the process dies, not at the next poll (`ExitWait`): a pidfd on
Linux, a kqueue's NOTE_EXIT on macOS, a plain sleep elsewhere. A process started before it was
needed, an attempt's spare (engine.run.spare), becomes one when its launcher hands it the attempt.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import sys
import time
from signal import Signals  # in annotations: AttemptProcess.signal hides the module there
from typing import TYPE_CHECKING, Callable

import psutil

from engine.record.identity import ProcessId

if TYPE_CHECKING:
    from engine.run.launch import Launch

TRAINER_STOP = (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL)


def spawn(argv: list[str] | str, *, restore_sigint: bool = False, **popen) -> subprocess.Popen:
    """Start `argv` in a session of its own (`popen`: subprocess.Popen's other keywords).

    `restore_sigint`: the process is stopped with SIGINT, which Python turns into
    KeyboardInterrupt only if it was not ignored when the script started; a supervisor started
    from a shell's `&` inherits it ignored and would pass that on. Only then is a preexec
    needed (it is unsafe beside threads, so it is not used otherwise)."""
    restore = restore_sigint and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    # SLURM's warning (SIGUSR1) reaches every process of a job's step, on each of several nodes:
    # a supervisor that handles it (engine.run.slurm) owns it, and what it starts must not die of
    # it (a handled signal is SIG_DFL after exec, an ignored one stays ignored; a process that
    # wants it, as Lightning does, installs its own handler).
    ignore_warning = callable(signal.getsignal(signal.SIGUSR1))
    preexec = functools.partial(_child_signals, restore, ignore_warning) if restore or ignore_warning else None
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=preexec, **popen)


def _child_signals(default_sigint: bool, ignore_warning: bool) -> None:
    if default_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if ignore_warning:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def signal_group(leader: int, sig: signal.Signals, *, strays: bool = True) -> None:
    """The process group `leader` leads, and its descendants that left it for a session of
    their own (torchrun starts every worker with start_new_session). `strays`: False once the
    leader was reaped, when its pid may be another process's."""
    found: list[psutil.Process] = []
    try:
        found = psutil.Process(leader).children(recursive=True) if strays else []
    except psutil.Error:
        pass  # the leader is gone; its group is still signalled below
    for target in [None, *(c for c in found if _left_group(c.pid, leader))]:
        try:
            if target is None:
                os.killpg(leader, sig)
            else:
                target.send_signal(sig)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass


def _left_group(pid: int, leader: int) -> bool:
    """In a process group of its own (a descendant gone since it was listed: no)."""
    try:
        return os.getpgid(pid) != leader
    except ProcessLookupError:
        return False


class ExitWait:
    """Sleep until a child of this process exits, or for at most `timeout_s`: the caller's loop
    wakes at once when it dies and keeps its cadence while it lives. Linux: a pidfd, readable
    once the process has exited; macOS: a kqueue's NOTE_EXIT; elsewhere (or where the kernel
    refuses either), a plain sleep. Made while the child is known not to have been reaped (so
    the pid is still its own)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd: int | None = None                # Linux: the pidfd
        self._kq = None                            # macOS: the kqueue, NOTE_EXIT registered
        self.exited = False                        # seen to have exited (the fd said so)
        try:
            if sys.platform == "linux" and hasattr(os, "pidfd_open"):   # Python 3.9, Linux 5.3
                self._fd = os.pidfd_open(pid)
            elif sys.platform == "darwin" and hasattr(select, "kqueue"):
                self._kq = select.kqueue()
                self._kq.control([select.kevent(pid, filter=select.KQ_FILTER_PROC,
                                                flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT,
                                                fflags=select.KQ_NOTE_EXIT)], 0, 0)
        except OSError:
            # No pidfd (a kernel before 5.3, a seccomp filter), or the process exited already
            # (macOS refuses NOTE_EXIT for a zombie): the sleep, and poll() says the rest.
            self.close()

    @property
    def wakes(self) -> bool:
        """It wakes on the exit (False: it only sleeps)."""
        return self._fd is not None or self._kq is not None

    def wait(self, timeout_s: float) -> bool:
        """Up to `timeout_s`; True if the process was seen to exit (False: the time ran out, or
        this platform cannot tell and only slept)."""
        if self.exited:
            return True
        try:
            if self._fd is not None:
                poller = select.poll()
                poller.register(self._fd, select.POLLIN)
                self.exited = bool(poller.poll(max(0.0, timeout_s) * 1000))
            elif self._kq is not None:
                self.exited = bool(self._kq.control(None, 1, max(0.0, timeout_s)))
            else:
                time.sleep(timeout_s)
        except InterruptedError:  # a signal handler ran (Python retries; kept for safety)
            pass
        except OSError:
            self.close()
            time.sleep(timeout_s)
        if self.exited:
            self.close()
        return self.exited

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._kq is not None:
            self._kq.close()
            self._kq = None

    def __del__(self):
        self.close()


class AttemptProcess:
    """One process in a session of its own: an attempt's, a probe worker's, a notify command's.

    Started here (`start`), wrapped (`AttemptProcess(popen)`), or found by identity (`adopt`: the
    lifeline's orphaned attempt, a process `cockpit adopt` follows). Where a signal goes is its
    launcher's word (`deliver`, one of the functions below: `to_group`, `to_process`,
    `to_workers`, `to_own_group`)."""

    def __init__(self, popen: subprocess.Popen | None = None, *, identity: ProcessId | None = None,
                 stop_signals: tuple[signal.Signals, ...] = TRAINER_STOP,
                 grace_s: float | None = None, deliver: Deliver | None = None):
        self.popen = popen
        self.identity = identity
        self.pid = popen.pid if popen is not None else self._adopted().pid
        self.stop_signals = tuple(stop_signals)
        self.grace_s = grace_s          # each stop signal escalates to the next after this long
        self.deliver: Deliver = deliver or to_group
        self.stops_sent = 0             # how many of the stop signals were sent...
        self.stop_sent_at = 0.0         # ...and when the last one was (monotonic)
        self._exit_wait: ExitWait | None = None   # what wakes `wait` at the exit, once it waits

    @classmethod
    def start(cls, launch: Launch, log, deliver: Deliver) -> AttemptProcess:
        """An attempt's process, its output into `log` (an open file). A launch stopped with
        SIGINT gets SIGINT back where this process ignores it. OSError if it cannot start."""
        popen = spawn(launch.argv, cwd=launch.cwd, stdin=subprocess.DEVNULL, stdout=log,
                      stderr=subprocess.STDOUT, env=launch.env,
                      restore_sigint=signal.SIGINT in launch.stop_signals)
        return cls(popen, stop_signals=launch.stop_signals, grace_s=launch.stop_grace_s, deliver=deliver)

    @classmethod
    def adopt(cls, identity: ProcessId, stop_signals: tuple[signal.Signals, ...], grace_s: float | None,
              deliver: Deliver) -> AttemptProcess:
        """A process this one did not start (the lifeline's orphaned attempt, a process `cockpit
        adopt` follows): by identity, so that a later process given the same pid is never
        signalled. Its exit status is its parent's to read: `returncode` stays None."""
        return cls(identity=identity, stop_signals=stop_signals, grace_s=grace_s, deliver=deliver)

    # ------------------------------------------------------------ state

    def _started(self) -> subprocess.Popen:
        assert self.popen is not None, "an adopted process's exit status is not ours to read"
        return self.popen

    def _adopted(self) -> ProcessId:
        assert self.identity is not None, "a process needs a Popen or an identity"
        return self.identity

    def poll(self) -> int | None:
        """Its exit status once it has ended (a negative signal number), else None."""
        return self._started().poll()

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status (as `returncode`), after waiting up to `timeout_s` for it to end: at
        once when it does (see ExitWait), whatever is left of the time otherwise."""
        if not self.alive():
            return self.returncode
        if self._exit_wait is None:   # alive (not reaped, or its identity's): the pid is its own
            self._exit_wait = ExitWait(self.pid)
        self._exit_wait.wait(timeout_s)
        if not self.alive():   # polled: a started process's status is read
            self._exit_wait.close()
        return self.returncode

    @property
    def returncode(self) -> int | None:
        """Its exit status once ended; None for an adopted process (not ours to read)."""
        return self.popen.returncode if self.popen is not None else None

    @property
    def running(self) -> bool:
        """Not seen to have ended (as of the last poll)."""
        return self.popen.returncode is None if self.popen is not None else self._adopted().alive()

    def alive(self) -> bool:
        return self.popen.poll() is None if self.popen is not None else self._adopted().alive()

    # ------------------------------------------------------------ signals

    def signal(self, sig: Signals) -> None:
        """A stop signal, where its launcher says it goes (`deliver`)."""
        try:
            self.deliver(self, sig)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass

    def signal_group(self, sig: Signals) -> None:
        """Its process group and torchrun's stray workers; once it has ended, SIGKILL alone (for
        what it left behind)."""
        running = self.running
        if sig != signal.SIGKILL and not running:
            return
        signal_group(self.pid, sig, strays=running)

    def kill(self) -> None:
        """SIGKILL to the group: a wedged process, or what an ended one left behind."""
        self.signal_group(signal.SIGKILL)

    # ------------------------------------------------------------ stopping

    def send_stop(self, *, skip_graceful: bool = False) -> None:
        """The next stop signal; `skip_graceful`: not the first, graceful one (a script that
        saves on Ctrl-C would save what must not be kept)."""
        if skip_graceful:
            self.stops_sent = 1
        self.signal(self.stop_signals[self.stops_sent])
        self.stops_sent += 1
        self.stop_sent_at = time.monotonic()

    def stop_delivered(self, grace_s: float) -> None:
        """Its next stop signal reached it from elsewhere (SLURM signals every process of a job):
        counted as sent, and the one after it is due after `grace_s` at most."""
        self.stops_sent += 1
        self.stop_sent_at = time.monotonic()
        self.grace_s = min(self.grace_s or grace_s, grace_s)

    def stop_overdue(self) -> bool:
        """A stop signal went unanswered for its grace period, and a further one is left."""
        return bool(self.grace_s) and 0 < self.stops_sent < len(self.stop_signals) and \
            time.monotonic() - self.stop_sent_at > (self.grace_s or 0.0)

    def stop(self, poll_s: float) -> Signals | None:
        """The whole stop sequence at once, each signal given its grace to work, then SIGKILL to
        the group for what it left behind (DataLoader workers); returns the last stop signal
        sent (None: it was gone already)."""
        if self.alive():  # a command paused by the `slow` fault must run to hear its stop
            self.signal_group(signal.SIGCONT)
        sent = self._escalate(self.stop_signals, self.grace_s or 0.0, poll_s)
        self.kill()
        return sent

    def end_hung(self, grace_s: float, poll_s: float) -> None:
        """SIGTERM first (a slow step can still checkpoint and exit), then SIGKILL: a wedged
        kernel answers nothing else."""
        if self._escalate((signal.SIGTERM, signal.SIGKILL), grace_s, poll_s) == signal.SIGKILL:
            self._started().wait()

    def _escalate(self, signals, grace_s: float, poll_s: float) -> Signals | None:
        sent = None
        for sig in signals:
            if not self.alive():
                break
            self.signal(sig)
            sent = sig
            deadline = time.monotonic() + grace_s
            while self.alive() and (left := deadline - time.monotonic()) > 0:
                self.wait(min(poll_s, left))   # wakes as it exits
        return sent


# Where a stop signal goes: each launcher names one (engine.run.launchers).
Deliver = Callable[[AttemptProcess, Signals], None]


def to_group(process: AttemptProcess, sig: Signals) -> None:
    """Its whole process group, as a terminal's Ctrl-C (a command: the script and its
    DataLoader workers), and torchrun's stray workers."""
    process.signal_group(sig)


def to_process(process: AttemptProcess, sig: Signals) -> None:
    """The process itself (the trainer: it checkpoints and tells its own children); SIGKILL to
    the whole group, for what it leaves behind."""
    if sig == signal.SIGKILL:
        process.signal_group(sig)
    elif process.popen is not None:
        process.popen.send_signal(sig)
    else:
        os.kill(process.pid, sig)


def to_workers(process: AttemptProcess, sig: Signals) -> None:
    """torchrun's workers, each of its own session, so that every rank checkpoints through the
    same stop agreement; SIGKILL to the whole group and the strays."""
    if sig == signal.SIGKILL:
        process.signal_group(sig)
        return
    for worker in psutil.Process(process.pid).children(recursive=True):
        worker.send_signal(sig)


def to_own_group(process: AttemptProcess, sig: Signals) -> None:
    """A process cockpit did not start, only while it is itself (never a stranger given its pid):
    its group where it leads one of its own (a shell's job, `python train.py &`), as a Ctrl-C in
    its terminal would; otherwise the process alone (its group is someone else's)."""
    if not process.alive():
        return
    if os.getpgid(process.pid) == process.pid and process.pid != os.getpgrp():
        os.killpg(process.pid, sig)
    else:
        os.kill(process.pid, sig)
