"""Which Python a user's command runs, and whether that Python can import cockpit.report.

A fault that cockpit.report raises inside the script (engine.vocabulary.REPORTED_KINDS) can only
fire where the command's own interpreter imports cockpit.report: engine.runconfig.check_faults
asks `reporter` before the run starts, and refuses the fault in one line where it cannot.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_PYTHON = re.compile(r"(python|pypy)[0-9.]*(\.exe)?", re.IGNORECASE)
# Run by the command's own interpreter: the script's sys.path[0] in place of -c's working
# directory (unless -P or -I keep it out), then where a top-level `cockpit` with a report.py is;
# find_spec of a top-level name imports nothing.
_FINDS_REPORT = """\
import importlib.util, os, sys
if not (getattr(sys.flags, "safe_path", False) or sys.flags.isolated) and sys.path[:1] == [""]:
    sys.path[0] = sys.argv[1]
spec = importlib.util.find_spec("cockpit")
places = (spec.submodule_search_locations or []) if spec else []
sys.exit(0 if any(os.path.isfile(os.path.join(p, "report.py")) for p in places) else 3)
"""


def reporter(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[str, bool] | None:
    """(the interpreter with its flags, whether it can import cockpit.report) for a command: the
    program itself when it is a Python interpreter (asked with its own flags and the sys.path its
    script would get), or the interpreter a #! line names (torchrun, accelerate: their workers
    run the script with it). None when that cannot be known: a shell script or a binary may
    start any Python, and an interpreter that does not answer says nothing."""
    program = _program(argv[0], cwd, env)
    if program is None:
        return None
    if _PYTHON.fullmatch(os.path.basename(program)):
        python, flags, first = program, *_interpreter_args(argv[1:], cwd)
    elif (shebang := _shebang_python(program, env)) is not None:
        python = shebang
        script = next((a for a in argv[1:] if a.endswith(".py") and not a.startswith("-")), None)
        flags, first = [], os.path.dirname(os.path.abspath(os.path.join(cwd, script))) if script else cwd
    else:
        return None
    try:
        done = subprocess.run([python, *flags, "-c", _FINDS_REPORT, first], cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    shown = " ".join([python, *flags])
    return {0: (shown, True), 3: (shown, False)}.get(done.returncode)


def python_parts(argv: list[str], cwd: str) -> tuple[list[str], list[str], str] | None:
    """A command that runs a script or a module in a Python interpreter, split as a spare
    (engine.handover) takes it: (the interpreter and its own options, the script or `-m MODULE`
    and their arguments, what sys.path[0] is for it); None for anything else (-c, a script on
    stdin, a shell, a binary, torchrun's wrapper, -m joined to other options: started as they
    are)."""
    if not argv or not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return None
    value = False
    for i, arg in enumerate(argv[1:], 1):
        if value:  # the value of -X, -W or --check-hash-based-pycs
            value = False
        elif arg in ("-X", "-W", "--check-hash-based-pycs"):
            value = True
        elif arg == "-m" and i + 1 < len(argv):   # sys.path[0]: the working directory, as getcwd() says it
            return argv[:i], argv[i:], os.path.realpath(cwd)
        elif arg in ("-", "--"):
            return None   # a script on stdin; -- before the script
        elif arg.startswith("-") and not arg.startswith("--"):   # options, one or several: -u, -uB, -Wignore
            for j, letter in enumerate(arg[1:], 2):
                if letter in "cm":
                    return None   # -c code; -m joined to other options
                if letter in "WX":   # its value: the rest of this argument, else the next one
                    value = j == len(arg)
                    break
        elif not arg.startswith("-"):   # sys.path[0]: the script's directory, symbolic links resolved
            return argv[:i], argv[i:], os.path.dirname(os.path.realpath(os.path.join(cwd, arg)))
    return None


def _program(name: str, cwd: str, env: dict[str, str]) -> str | None:
    if os.sep in name or (os.altsep and os.altsep in name):
        path = os.path.join(cwd, os.path.expanduser(name))
        return path if os.path.isfile(path) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _interpreter_args(args: list[str], cwd: str) -> tuple[list[str], str]:
    """A Python command line's own options (up to the script, -m or -c) and the directory its
    sys.path[0] would be: the script's, or the working directory for -m and -c."""
    flags, value = [], False
    for i, arg in enumerate(args):
        if value:  # the value of -X or -W
            value = False
        elif arg in ("-X", "-W"):
            flags += args[i:i + 2]
            value = True
        elif arg == "-" or arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return flags, cwd
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            return flags, os.path.dirname(os.path.abspath(os.path.join(cwd, arg)))
    return flags, cwd


def _shebang_python(path: str, env: dict[str, str]) -> str | None:
    """The Python interpreter a script's #! line names (`#!/usr/bin/env python3` included)."""
    try:
        with open(path, "rb") as f:
            line = f.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = line[2:].split() if line.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        if not words:
            return None
        words[0] = shutil.which(words[0], path=env.get("PATH", os.defpath)) or words[0]
    if words and _PYTHON.fullmatch(os.path.basename(words[0])) and os.path.isfile(words[0]):
        return words[0]
    return None
