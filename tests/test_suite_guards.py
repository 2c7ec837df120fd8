"""The suite's own promises (tests/conftest.py): what a test starts handles SIGINT by default even
when pytest was started with SIGINT ignored, and a process a test leaves running is killed and
fails that test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import psutil

from conftest import FIXTURES, ROOT


def test_under_an_ignored_sigint_children_get_it_back_and_a_leak_fails_its_test():
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 (as nohup leaves it)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           str(FIXTURES / "suite" / "guarded.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, preexec_fn=ignore,
                          env={**os.environ, "COCKPIT_TEST_LEAK_GRACE_S": "1"})
    out = done.stdout
    assert done.returncode == 1, out
    assert re.search(r"^PASSED .*::test_a_child_handles_sigint_by_default$", out, re.M), out
    assert re.search(r"^ERROR .*::test_that_leaves_a_detached_process", out, re.M), out
    # (the message may appear twice: in the error's section and in the summary)
    (leaked,) = set(re.findall(r"this test left 1 process\(es\) running \(killed now\): (\d+): sleep 600", out))
    assert not psutil.pid_exists(int(leaked)) or psutil.Process(int(leaked)).status() == psutil.STATUS_ZOMBIE
    assert re.search(r"^PASSED .*::test_that_leaves_nothing$", out, re.M), out
