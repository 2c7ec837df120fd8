"""`cockpit check`: does this device compute the right numbers for this workload?

    cockpit check -w trm-tiny -d mps                 the preset's device against the CPU in fp32
    cockpit check -w trm-tiny -d cuda --set precision=fp32
    cockpit check -w trm-tiny -d cpu --set precision=bf16 --inject wrong-grad@0   rehearse

The workload's real model and next batch go through forward, backward and one optimizer step
on the preset's device and on the CPU (engine.train.parity), in a worker process of their own:
a device that crashes instead says so and cannot take this command down with it.

Exit codes: 0 ok, 1 numerically wrong, 2 bad input, 3 the check could not run (a crash).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from engine import runconfig, vocabulary
from engine.errors import ConfigError
from engine.probe.measure import POLL_S, Worker

EXIT_OK, EXIT_WRONG, EXIT_BAD_INPUT, EXIT_CRASHED = 0, 1, 2, 3


def add_parser(sub) -> None:
    q = sub.add_parser("check", help="check a device's loss, gradients and optimizer step against "
                                     "the CPU in fp32",
                       description=__doc__.split("\n\n")[2].replace("\n", " "),
                       epilog="exit codes: 0 ok, 1 numerically wrong, 2 bad input, 3 the check "
                              "crashed", formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--workload", "-w", default="matmul", metavar="W", help="workload preset (default: matmul)")
    q.add_argument("--device", "-d", default="auto", metavar="D",
                   help="device preset to check (default: auto); its precision sets the tolerances")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, as for a run (batch_size=8, precision=fp32, params.n=128)")
    q.add_argument("--inject", action="append", default=[], metavar="wrong-grad@0",
                   help="rehearse: wrong-grad@0 makes the device's gradients wrong")
    q.add_argument("--json", action="store_true", help="print the parity event as JSON")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    for spec in args.inject:
        try:
            vocabulary.parse(spec)  # an unknown kind is told as such, with the kinds there are
        except ValueError as e:
            raise ConfigError("--inject", None, str(e)) from None
        if spec.rstrip("+") != "wrong-grad@0":
            raise ConfigError("--inject", None, f"got {spec!r}; the check trains no step, expected "
                                                "wrong-grad@0")
    overrides = list(args.set) + (["device.inject=" + json.dumps(args.inject)] if args.inject else [])
    config = runconfig.resolve(args.workload, args.device, overrides)
    if config.workload.is_command:
        raise ConfigError(f"workload {args.workload!r}", "command",
                          "is the user's own command: a parity check does not apply (cockpit cannot "
                          "run its model on the CPU beside it); expected a built-in or protocol workload")
    preset = dataclasses.replace(config.device, fallback=(), parity_check=True)
    if preset.device == "cpu" and preset.precision in ("auto", "fp32"):
        raise ConfigError(f"device preset {config.device_preset!r}", "device",
                          "computes on the CPU in fp32, the check's reference itself: nothing to "
                          "compare; expected another device (or --set precision=bf16)")
    _say(f"checking {config.workload_preset} on device preset {config.device_preset!r} "
         f"({preset.device}, {preset.precision}) against the CPU in fp32 ...")
    started = time.monotonic()
    silent_s = None
    with _terminations_as_interrupts(), tempfile.TemporaryDirectory(prefix="cockpit-check-") as scratch:
        worker = Worker(config, preset, Path(scratch), parity="only", preset_name=config.device_preset)
        heard = time.monotonic()
        try:
            while worker.alive:
                if worker.poll():
                    heard = time.monotonic()
                elif time.monotonic() - heard > preset.hang_timeout_s:
                    silent_s = time.monotonic() - heard  # a wedged device: as a run's hang
                    break
                time.sleep(POLL_S)
        finally:
            worker.kill("interrupted")  # Ctrl-C, a hang: it runs in its own session
        ended = worker.end()
        found = worker.of_type("parity")
    if silent_s is not None:
        print(f"cockpit check: the check could not run: the worker said nothing for {silent_s:.0f} s "
              f"(the preset's hang_timeout_s) and was stopped: a hang", file=sys.stderr)
        return EXIT_CRASHED
    if ended.config_error:  # already "device preset 'NAME': ...", the worker told its name
        print(f"cockpit: {ended.config_error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not found:
        why = ended.verdict.sentence if ended.verdict else "it was interrupted"
        evidence = (ended.verdict.evidence.get("message") if ended.verdict else None) or ""
        print(f"cockpit check: the check could not run: {why}" + (f" ({evidence})" if evidence else ""),
              file=sys.stderr)
        return EXIT_CRASHED
    result = found[0]
    if result["device"] == "cpu" and result["precision"] == "fp32":  # auto found no accelerator
        _say("note: this machine's device is the CPU in fp32, the check's reference itself: an "
             "ok says only that the check runs")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}, indent=1))
    else:
        print(report(result, config.workload_preset, time.monotonic() - started))
    return EXIT_OK if result["ok"] else EXIT_WRONG


def report(p: dict, workload: str, seconds: float) -> str:
    """The parity event as a few lines a user reads."""
    t = p["tolerance"]

    def row(what: str, rel: float | None, tol: float, name: str | None = None) -> str:
        err = "not finite" if rel is None else f"{rel:.2e}"
        flag = "ok" if rel is not None and rel <= tol else "WRONG"
        return f"  {what:22} {err:>10}  (tolerance {tol:<6g})  {flag:5}  {name or ''}".rstrip()

    lines = [f"{workload} on {p['device']} in {p['precision']}, batch {p['batch']}, against the CPU "
             f"in fp32 ({p['seconds']:.1f} s of checking, {seconds:.0f} s in all)",
             f"  loss {p['loss']:.6g} on the device, {p['cpu_loss']:.6g} on the CPU",
             row("loss, relative error", p["loss_rel"], t["loss"]),
             row("worst gradient", p["worst_grad"]["rel"], t["grad"], p["worst_grad"]["name"]),
             row("worst update", p["worst_update"]["rel"], t["update"], p["worst_update"]["name"]),
             f"verdict: {p['verdict']}" + ("" if p["ok"] else f" — {'; '.join(p['problems'])}")]
    return "\n".join(lines)


@contextlib.contextmanager
def _terminations_as_interrupts():
    """SIGTERM and SIGHUP (a closed terminal, `timeout`) end the check as Ctrl-C does, so the
    worker, in a session of its own, is stopped and its scratch directory removed."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
