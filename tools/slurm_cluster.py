"""A one-node SLURM cluster under a directory of its own, for the tests and for trying things.

    python tools/slurm_cluster.py start [--dir DIR] [--cpus N] [--timeout S]
    python tools/slurm_cluster.py status [--dir DIR]
    python tools/slurm_cluster.py stop [--dir DIR]

`start` installs slurmctld, slurmd, slurm-client and munge from the distribution when they are
absent (apt-get, as root; `apt-get update` only when the lists lack them), makes a munge key,
starts munged, writes a slurm.conf for one node, `localhost`, and starts slurmctld and slurmd
(no systemd, no cgroups: proctrack/linuxproc, task/none), all of it under DIR: key, sockets,
state, spool, pid files and logs. It waits until sinfo shows the node idle, then prints what a
client needs as `export` lines (so `eval "$(python tools/slurm_cluster.py start)"` works) and
writes them to DIR/env.sh and DIR/env.json. DIR defaults to a fresh temporary directory, which
`stop` removes. The cluster uses free ports of its own, so two can run side by side.

`stop` cancels the jobs left, stops slurmd, slurmctld and munged (from their pid files, each
checked to be this cluster's) and whatever job step outlived them. Without --dir, `stop` and
`status` take the cluster of $COCKPIT_SLURM_CONF or $SLURM_CONF.

The node declares at least 8 CPUs (config_overrides lets it declare more than it has), so
several tests' jobs, which mostly wait, run side by side instead of queueing. A requeued job
starts again in about 12 s (cred_expire=10, sched_interval=2) instead of about 2 minutes.
Finished jobs are in `scontrol show job` for MinJobAge (5 minutes) and in DIR/log/jobcomp.txt
(jobcomp/filetxt: there is no slurmdbd, so no sacct).

A fresh cluster's first job may wait about 3 s for slurmctld's first scheduling pass; later ones
start at once.

Exit status: 0 done (status: up); 1 it failed (status: down) (the line says what, the log's tail follows); 2 it cannot be
done here (not Linux, not root, no apt-get, the install failed), or bad usage. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
# the programs start needs, and the package each comes from
PROGRAMS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
            "sinfo": "slurm-client", "scontrol": "slurm-client", "scancel": "slurm-client",
            "squeue": "slurm-client", "munged": "munge", "mungekey": "munge"}
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
DAEMONS = ["slurmd", "slurmctld", "munged"]  # the order stop takes them in
STATE_FILE = "cluster.json"
MIN_CPUS = 8
# a unix socket's path is at most 107 bytes; slurmd's step sockets add about 40 to DIR
MAX_DIR_LEN = 60


class CannotHere(Exception):
    """It cannot be done on this machine (exit 2)."""


class Failed(Exception):
    """It was tried and failed (exit 1)."""


def say(text: str) -> None:
    print(f"slurm_cluster: {text}", file=sys.stderr, flush=True)


def program(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


# ---------------------------------------------------------------- installing

def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if program(name) is None]


def ensure_installed() -> None:
    missing = missing_programs()
    if not missing:
        return
    packages = sorted({PROGRAMS[name] for name in missing}, key=PACKAGES.index)
    what = f"{', '.join(missing)} absent (packages {' '.join(packages)})"
    if not sys.platform.startswith("linux"):
        raise CannotHere(f"{what}, and this is not Linux: a one-node cluster is made on Linux only")
    if os.geteuid() != 0:
        raise CannotHere(f"{what}, and installing them needs root: "
                         f"apt-get install --no-install-recommends {' '.join(PACKAGES)}")
    if program("apt-get") is None:
        raise CannotHere(f"{what}, and there is no apt-get to install them with")
    began = time.monotonic()
    say(f"installing {' '.join(PACKAGES)} ({what}) ...")
    done = _apt_install()
    if done.returncode != 0 and re.search(r"Unable to locate package|has no installation candidate"
                                          r"|Failed to fetch|404\s+Not Found", done.stdout):
        say("the package lists lack them or are stale: apt-get update ...")
        update = _apt(["apt-get", "update"])
        if update.returncode != 0:
            raise CannotHere("apt-get update failed: " + _tail_text(update.stdout, 5))
        done = _apt_install()
    if done.returncode != 0:
        raise CannotHere(f"apt-get install {' '.join(PACKAGES)} failed (exit {done.returncode}): "
                         + _tail_text(done.stdout, 5))
    if still := missing_programs():
        raise CannotHere(f"after the install, {', '.join(still)} still absent")
    say(f"installed {' '.join(PACKAGES)} in {time.monotonic() - began:.1f} s")


def _apt(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _apt_install() -> subprocess.CompletedProcess:
    return _apt(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES])


# ---------------------------------------------------------------- the directory

class Cluster:
    """The paths of a cluster under DIR."""

    def __init__(self, root: Path):
        self.dir = root
        self.conf = root / "slurm.conf"
        self.munge = root / "munge"
        self.socket = self.munge / "munge.socket"
        self.key = self.munge / "munge.key"
        self.state = root / "state"
        self.spool = root / "spool"
        self.run = root / "run"
        self.log = root / "log"
        self.jobcomp = self.log / "jobcomp.txt"
        self.state_file = root / STATE_FILE

    def pid_file(self, daemon: str) -> Path:
        return self.munge / "munged.pid" if daemon == "munged" else self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.munge / "munged.log" if daemon == "munged" else self.log / f"{daemon}.log"

    def env(self) -> dict[str, str]:
        """What a client (sbatch, srun, squeue, sinfo, scontrol, scancel) needs."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self) -> dict[str, str]:
        # not a SLURM_* of a job this runs inside: srun there would make a step of that job
        return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **self.env()}

    def recorded(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}


def default_dir() -> Path | None:
    for var in ("COCKPIT_SLURM_CONF", "SLURM_CONF"):
        if conf := os.environ.get(var):
            root = Path(conf).resolve().parent
            if (root / STATE_FILE).exists():
                return root
    return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"    ({path} is not there)"
    return "\n".join(f"    {line}" for line in text.splitlines()[-lines:]) or f"    ({path} is empty)"


def _tail_text(text: str, lines: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _mem_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(1, int(line.split()[1]) // 1024)
    except (OSError, ValueError, IndexError):
        pass
    return 1024


def _free_ports(n: int) -> list[int]:
    """n distinct ports free now (bound and released; the daemons take them a moment later)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def slurm_conf(c: Cluster, *, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
# Written by tools/slurm_cluster.py: a one-node cluster under {c.dir}
ClusterName=cockpit
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire (120 s by default) before it starts again: slurm 22.05
# (Debian 12) reads it here only; SlurmctldParameters' below, for newer releases, alone left 122 s
AuthInfo=socket={c.socket},cred_expire=10
StateSaveLocation={c.state}
SlurmdSpoolDir={c.spool}
SlurmctldPidFile={c.pid_file("slurmctld")}
SlurmdPidFile={c.pid_file("slurmd")}
SlurmctldLogFile={c.log_file("slurmctld")}
SlurmdLogFile={c.log_file("slurmd")}
SlurmctldDebug=info
SlurmdDebug=info
# no systemd and no cgroups here
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# no slurmdbd: finished jobs are read from scontrol (for MinJobAge) and this file
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={c.jobcomp}
SlurmctldParameters=cred_expire=10
SchedulerParameters=sched_interval=2
MailProg=/bin/true
# short timeouts: a test waits on them
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
TCPTimeout=2
BatchStartTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=300
ReturnToService=2
JobRequeue=1
# the node may declare more CPUs than it has (the tests' jobs mostly wait)
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_mem_mb()} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


# ---------------------------------------------------------------- processes

def _alive(pid: int) -> bool:
    """Running, not a zombie (nothing here may reap a daemon that ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except (OSError, ValueError, IndexError):
        if sys.platform.startswith("linux"):
            return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def daemon_pid(c: Cluster, daemon: str) -> int | None:
    """The daemon's pid from its pid file, when that process is alive and is this cluster's."""
    try:
        pid = int(c.pid_file(daemon).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    cmd = _cmdline(pid)
    if not _alive(pid) or daemon not in cmd or str(c.dir) + os.sep not in cmd:
        return None
    return pid


def _daemon_env() -> dict[str, str]:
    """The daemons get a plain environment, not the caller's: a test session marks its processes
    in theirs (tests/conftest.py), and the cluster outlives any one test."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "TZ") if k in os.environ}
    return {**keep, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def _start_daemon(c: Cluster, daemon: str, cmd: list[str]) -> int:
    out = c.log / f"{daemon}.out"
    with open(out, "ab") as f:
        done = subprocess.run(cmd, env=_daemon_env(), stdin=subprocess.DEVNULL, stdout=f,
                              stderr=subprocess.STDOUT, start_new_session=True, cwd=c.dir,
                              timeout=60)
    if done.returncode != 0:
        raise Failed(f"{daemon} did not start (exit {done.returncode}): {' '.join(cmd)}\n"
                     f"{_tail(out)}\n{_tail(c.log_file(daemon))}")
    deadline = time.monotonic() + 15
    while (pid := daemon_pid(c, daemon)) is None:
        if time.monotonic() > deadline:
            raise Failed(f"{daemon} started but wrote no pid file, or ended: {c.pid_file(daemon)}\n"
                         f"{_tail(c.log_file(daemon))}\n{_tail(out)}")
        time.sleep(0.05)
    return pid


def client(c: Cluster, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(args), env=c.client_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(list(args), 1, "", str(e))


def node_state(c: Cluster) -> str:
    done = client(c, "sinfo", "-h", "-N", "-n", "localhost", "-o", "%T", timeout=10)
    return done.stdout.strip() if done.returncode == 0 else ""


# ---------------------------------------------------------------- start

def _prepare_dir(arg: str | None) -> tuple[Cluster, bool]:
    if arg is None:
        root, temporary = Path(tempfile.mkdtemp(prefix="cockpit-slurm-")), True
    else:
        root, temporary = Path(arg).resolve(), False
        if root.exists() and any(root.iterdir()) and not (root / STATE_FILE).exists():
            raise CannotHere(f"{root} is neither empty nor a cluster's directory ({STATE_FILE}); "
                             "give an empty or new directory")
        root.mkdir(parents=True, exist_ok=True)
    if len(str(root)) > MAX_DIR_LEN:
        raise CannotHere(f"{root} is too long a path ({len(str(root))} > {MAX_DIR_LEN} characters): "
                         "the unix sockets under it would pass 107 bytes")
    c = Cluster(root)
    for stale in (c.state, c.spool, c.run, c.munge):  # a cluster of this directory before
        shutil.rmtree(stale, ignore_errors=True)
    # munged refuses a socket whose directories others cannot search (a mkdtemp is 0700)
    for d in (root, c.munge, c.state, c.spool, c.run, c.log):
        d.mkdir(exist_ok=True)
        d.chmod(0o755)
    for parent in root.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise CannotHere(f"{parent} is not searchable by others (o+x), which munged requires "
                             f"of its socket's directories: give a --dir elsewhere (under /tmp)")
    return c, temporary


def start(args: argparse.Namespace) -> int:
    if not sys.platform.startswith("linux"):
        raise CannotHere("a one-node SLURM cluster is made on Linux only")
    ensure_installed()
    if os.geteuid() != 0:
        raise CannotHere("the daemons run as root (slurmd starts jobs as their user): run it as root")
    if args.dir and (Path(args.dir) / STATE_FILE).exists() and is_up(Cluster(Path(args.dir).resolve())):
        say(f"already up in {Path(args.dir).resolve()}")
        return _announce(Cluster(Path(args.dir).resolve()), 0.0)
    began = time.monotonic()
    c, temporary = _prepare_dir(args.dir)
    ctld_port, slurmd_port = _free_ports(2)
    cpus = args.cpus or max(os.cpu_count() or 1, MIN_CPUS)
    c.state_file.write_text(json.dumps({
        "dir": str(c.dir), "conf": str(c.conf), "temporary": temporary, "jobcomp": str(c.jobcomp),
        "slurmctld_port": ctld_port, "slurmd_port": slurmd_port, "cpus": cpus}, indent=1) + "\n")
    try:
        c.conf.write_text(slurm_conf(c, cpus=cpus, ctld_port=ctld_port, slurmd_port=slurmd_port))
        done = subprocess.run([program("mungekey") or "mungekey", "-c", "-k", str(c.key)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise Failed(f"mungekey -c -k {c.key} failed: {_tail_text(done.stderr, 3)}")
        c.key.chmod(0o600)
        _start_daemon(c, "munged", [program("munged") or "munged", f"--socket={c.socket}",
                                    f"--key-file={c.key}", f"--pid-file={c.pid_file('munged')}",
                                    f"--log-file={c.log_file('munged')}",
                                    f"--seed-file={c.munge / 'munged.seed'}"])
        _start_daemon(c, "slurmctld", [program("slurmctld") or "slurmctld", "-f", str(c.conf)])
        _start_daemon(c, "slurmd", [program("slurmd") or "slurmd", "-f", str(c.conf), "-N", "localhost"])
        _wait_idle(c, args.timeout)
    except BaseException as e:  # Failed, or ^C: nothing is left running
        if isinstance(e, Failed):
            say(str(e))
        _stop_daemons(c)
        say(f"stopped what had started; the logs are kept in {c.dir}")
        if isinstance(e, Failed):
            return 1
        raise
    return _announce(c, time.monotonic() - began)


def _wait_idle(c: Cluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for daemon in ("munged", "slurmctld", "slurmd"):
            if daemon_pid(c, daemon) is None:
                raise Failed(f"{daemon} ended while the cluster started; its log's tail:\n"
                             f"{_tail(c.log_file(daemon))}")
        state = node_state(c)
        if state == "idle":
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    reason = client(c, "scontrol", "show", "node", "localhost").stdout
    found = re.search(r"Reason=(.*)", reason)
    raise Failed(f"the node localhost is not idle after {timeout:.0f} s (sinfo says "
                 f"{state or 'nothing: slurmctld does not answer'}"
                 f"{'; reason ' + found.group(1).strip() if found else ''}); the logs' tails:\n"
                 f"  {c.log_file('slurmctld')}:\n{_tail(c.log_file('slurmctld'))}\n"
                 f"  {c.log_file('slurmd')}:\n{_tail(c.log_file('slurmd'))}")


def _announce(c: Cluster, took: float) -> int:
    env = c.env()
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    (c.dir / "env.sh").write_text("\n".join(lines) + "\n")
    (c.dir / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    print(f"# a one-node SLURM cluster is up in {c.dir} (started in {took:.1f} s); stop it with:\n"
          f"# python {Path(__file__).relative_to(Path.cwd()) if _under_cwd() else __file__} "
          f"stop --dir {c.dir}")
    print("\n".join(lines), flush=True)
    return 0


def _under_cwd() -> bool:
    try:
        Path(__file__).resolve().relative_to(Path.cwd())
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- status and stop

def is_up(c: Cluster) -> bool:
    return all(daemon_pid(c, d) for d in DAEMONS) and node_state(c) != ""


def status(args: argparse.Namespace) -> int:
    c = _named(args)
    pids = {d: daemon_pid(c, d) for d in DAEMONS}
    state = node_state(c) if pids["slurmctld"] and pids["munged"] else ""
    daemons = ", ".join(f"{d} {pids[d] or 'down'}" for d in reversed(DAEMONS))
    if all(pids.values()) and state:
        print(f"up: {c.dir} ({daemons}); node localhost {state}; SLURM_CONF={c.conf}")
        return 0
    print(f"down: {c.dir} ({daemons}{'; slurmctld does not answer' if pids['slurmctld'] else ''})")
    return 1


def _named(args: argparse.Namespace) -> Cluster:
    root = Path(args.dir).resolve() if args.dir else default_dir()
    if root is None:
        raise CannotHere("which cluster? give --dir DIR (or set COCKPIT_SLURM_CONF or SLURM_CONF "
                         "to its slurm.conf)")
    if not (root / STATE_FILE).exists():
        raise CannotHere(f"{root} is not a cluster's directory (no {STATE_FILE})")
    return Cluster(root)


def stop(args: argparse.Namespace) -> int:
    c = _named(args)
    _stop_daemons(c)
    if c.recorded().get("temporary"):
        shutil.rmtree(c.dir, ignore_errors=True)
        say(f"stopped; removed {c.dir}")
    else:
        say(f"stopped; {c.dir} kept")
    return 0


def _stop_daemons(c: Cluster) -> None:
    if daemon_pid(c, "slurmctld") and daemon_pid(c, "munged"):
        _cancel_jobs(c, wait=daemon_pid(c, "slurmd") is not None)
    for daemon in DAEMONS:
        if (pid := daemon_pid(c, daemon)) is not None:
            _end(pid, daemon)
        if daemon == "slurmd":
            _end_steps(c)  # a step that outlived its slurmd, and its processes


def _cancel_jobs(c: Cluster, *, wait: bool) -> None:
    jobs = client(c, "squeue", "-h", "-o", "%A").stdout.split()
    if not jobs:
        return
    say(f"cancelling {len(jobs)} job(s) left: {' '.join(jobs)}")
    client(c, "scancel", *jobs)
    if not wait:  # no slurmd to end them: their steps are ended below
        return
    deadline = time.monotonic() + 30  # KillWait is 5 s
    while time.monotonic() < deadline:
        listed = client(c, "squeue", "-h", "-o", "%A")
        if listed.returncode != 0 or not listed.stdout.strip():
            return
        time.sleep(0.2)
    say("jobs still listed after 30 s; their processes are ended with the daemons")


def _end(pid: int, what: str, grace: float = 10) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        say(f"{what} ({pid}) still running {grace:.0f} s after SIGTERM: SIGKILL")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _end_steps(c: Cluster) -> None:
    """slurmstepd processes of this cluster, with their descendants (proctrack/linuxproc knows a
    step's processes by the same parent chain). A step's working directory is slurmd's, and it
    holds slurmd's log open: both are under DIR (its sockets' fds name no path)."""
    if not sys.platform.startswith("linux"):
        return
    under = str(c.dir) + os.sep
    children: dict[int, list[int]] = {}
    steps = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
        if "slurmstepd" in _cmdline(pid):
            try:
                if any(os.readlink(f).startswith(under)
                       for f in [entry / "cwd", *(entry / "fd").iterdir()]):
                    steps.append(pid)
            except OSError:
                continue
    doomed, todo = [], list(steps)
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo.extend(children.get(pid, []))
    if doomed:
        say(f"ending {len(steps)} job step(s) that outlived slurmd, {len(doomed)} process(es)")
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurm_cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--dir", help="the cluster's directory (start: default a fresh temporary "
                                      "one; stop, status: default that of $COCKPIT_SLURM_CONF or $SLURM_CONF)")
    parser.add_argument("--cpus", type=int, default=0,
                        help=f"CPUs the node declares (default: the cores, at least {MIN_CPUS})")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds start waits for the node to be idle (default 60)")
    args = parser.parse_args(argv)
    try:
        return {"start": start, "stop": stop, "status": status}[args.action](args)
    except CannotHere as e:
        say(str(e))
        return 2
    except Failed as e:
        say(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
