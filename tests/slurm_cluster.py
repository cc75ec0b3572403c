"""A real Slurm cluster on this machine for the tests: munged, slurmctld and two slurmd (node names n1 and n2,
one CPU each) on free localhost ports, their state, logs and munge key in a folder of their own. `start`
returns the environment that points sbatch, squeue and scancel at it (SLURM_CONF); `stop` ends the daemons.
Debian's slurm-wlm and munge provide the programs (.ci/run installs them); without them, or when the daemons
cannot start here, `start` says why and the tests skip."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    pids: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for pid_file in self.pids:
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError):
                pass


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start(root: Path, settings: str = "") -> Cluster | str:
    """The running cluster, or why it cannot run on this machine; `settings`: more lines of its slurm.conf."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"no Slurm here ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test cluster's daemons run as root (SlurmUser=root), and this is not root"
    root.mkdir(parents=True, exist_ok=True)
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    (munge / "munge.key").write_bytes(os.urandom(128))
    (munge / "munge.key").chmod(0o400)
    ctld, node1, node2 = free_ports(3)
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=kilntest
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
SchedulerParameters=sched_interval=1
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={node1} CPUs=1 RealMemory=1000
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={node2} CPUs=1 RealMemory=1000
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
{settings}"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root, env, [munge / "munged.pid", root / "slurmctld.pid"])
    commands = [
        [
            "munged",
            "--force",
            f"--key-file={munge}/munge.key",
            f"--socket={munge}/munge.socket",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/seed",
            f"--log-file={munge}/log",
        ],
        ["slurmctld", "-c", "-f", str(conf)],
        ["slurmd", "-N", "n1", "-f", str(conf)],
        ["slurmd", "-N", "n2", "-f", str(conf)],
    ]
    cluster.pids += [root / "slurmd.n1.pid", root / "slurmd.n2.pid"]
    for cmd in commands:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            cluster.stop()
            logs = " ".join(p.read_text()[-300:] for p in sorted(root.glob("*.log")))
            return f"{cmd[0]} did not start: {(done.stderr or done.stdout).strip()[-300:]} {logs}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        idle = subprocess.run(["sinfo", "-h", "-o", "%T %D"], env=env, capture_output=True, text=True).stdout
        if idle.split()[:2] == ["idle", "2"]:
            return cluster
        time.sleep(0.3)
    cluster.stop()
    return f"the test cluster's two nodes were not idle after 30 s (sinfo: {idle.strip()!r}; logs in {root})"


# Task functions for the executor's tests, importable by the array elements (PYTHONPATH names this folder).
def square(x: int) -> int:
    return x * x


def die_once(job: tuple[str, int]) -> int:
    """Ends its array element without a result the first time it runs for a task (as a node lost mid-task)."""
    folder, x = job
    mark = Path(folder) / f"ran-{x}"
    if not mark.exists():
        mark.write_text("")
        os._exit(9)
    return x


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def refuse(x: int) -> int:
    raise ValueError(f"task {x} refuses")
