"""`cockpit runs log`: an attempt's output headless -- its last lines as a terminal left them,
followed to the run's end and on into the next attempt, and a crash's traceback."""

from __future__ import annotations

import threading

from cockpit.cli import main
from engine.record.attempt_log import LogLines
from ui_support import copy_run, fake_live

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad batch\n'


def test_last_lines_as_a_terminal_left_them(home, capsys):
    path = copy_run(home, "crash-fallback")
    (path / "attempt-2.log").write_bytes(
        b"".join(b"line %d\n" % i for i in range(100)) + b"\x1b[32m 10%|#\r100%|##########|\x1b[0m\n")
    assert main(["runs", "log", str(path), "-n", "3"]) == 0
    assert capsys.readouterr().out == "line 98\nline 99\n100%|##########|\n"
    assert main(["runs", "log", str(path), "--attempt", "1"]) == 0   # empty: a native crash
    assert capsys.readouterr().out == ""
    assert main(["runs", "log", str(path), "--attempt", "7"]) == 2
    assert "has attempts 1, 2" in capsys.readouterr().err


def test_bad_arguments_are_refused(home, capsys):
    path = copy_run(home, "crash-fallback")
    no_such = f"cockpit: --attempt: 9: run {path.name} has attempts 1, 2"
    for args, words in ((["-n", "-5"], "cockpit: --lines: got -5, expected 1 or more"),
                        (["-a", "9"], no_such), (["-t", "-a", "9"], no_such)):
        assert main(["runs", "log", str(path), *args]) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith(words), (args, err)
    assert main(["runs", "log", str(path), "-t", "-a", "2"]) == 1   # there, but it did not crash
    assert f"attempt 2 of run {path.name} did not crash" in capsys.readouterr().out


def test_traceback_of_the_crashed_attempt(home, capsys):
    path = copy_run(home, "crash-fallback")
    assert main(["runs", "log", str(path), "--traceback"]) == 1     # SIGABRT: no traceback
    out = capsys.readouterr().out
    assert "attempt 1 (auto) ended native-crash" in out and "holds no Python traceback" in out
    (path / "attempt-1.log").write_text("step 1\nstep 2\n" + TRACEBACK)
    assert main(["runs", "log", str(path), "-t"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("--- attempt-1.log, line 3 ---\n" + TRACEBACK)
    finished = copy_run(home, "finished")
    assert main(["runs", "log", str(finished), "--traceback"]) == 1
    assert "no attempt of run" in capsys.readouterr().out


def test_follow_prints_what_is_appended_into_the_next_attempt_until_the_run_ends(home, capsys,
                                                                               monkeypatch):
    path = copy_run(home, "crash-fallback")
    fake_live(path)   # a live supervisor: this process
    polled = threading.Event()

    def the_run_goes_on():
        polled.wait()
        with open(path / "attempt-2.log", "a") as f:
            f.write("step 13\nstep 14\n")
        (path / "attempt-3.log").write_text("attempt 3 starts\n")
        (path / "supervisor.pid").unlink()   # the run ends

    reads = []
    real_read = LogLines.read

    def read(self):
        reads.append(self.path.name)
        if len(reads) == 2:   # following has begun (the first read printed the tail)
            polled.set()
        return real_read(self)

    monkeypatch.setattr(LogLines, "read", read)
    writer = threading.Thread(target=the_run_goes_on)
    writer.start()
    try:
        assert main(["runs", "log", str(path), "--follow"]) == 0
    finally:
        polled.set()
        writer.join()
    assert capsys.readouterr().out == ("attempt 2: finished at step 12/12\nstep 13\nstep 14\n"
                                       "--- attempt 3: attempt-3.log ---\nattempt 3 starts\n")
