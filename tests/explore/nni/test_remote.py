"""NNI's remote training service, end to end: real trials over SSH to a throwaway sshd on this machine.

The test starts its own OpenSSH server on 127.0.0.1 with everything in tmp_path, points an
experiment's ``machineList`` at it and runs the project's runner (`run_experiment`), so
NNI connects, installs its trial keeper, uploads the code and runs `nni_trial` as it
would on a real worker. What each sshd_config line is for:

* ``ListenAddress 127.0.0.1`` / ``Port``: reachable from this machine only, on a free port,
  so it never clashes with a real sshd on 22.
* ``HostKey``: a key generated for this test; the system's host keys may not exist and
  are not ours to read.
* ``AuthorizedKeysFile`` (absolute) with ``PubkeyAuthentication yes``: the throwaway client
  key logs in without touching ``~/.ssh``.
* ``PasswordAuthentication no``, ``KbdInteractiveAuthentication no``, ``UsePAM no``: key
  only, and no PAM stack, which containers often lack or configure for a real login.
* ``PermitRootLogin prohibit-password``: root (as in a container) may log in, by key only;
  OpenSSH's default since 7.0, stated so the test does not rest on the build's default.
* ``StrictModes no``: tmp_path and its parents are not owned and mode-checked as sshd wants
  for ``~/.ssh``.
* ``PidFile``: the default /run/sshd.pid may belong to a real sshd.
* ``Subsystem sftp internal-sftp``: NNI uploads the code tarball and its trial keeper's
  config over SFTP; the built-in server needs no sftp-server binary.
* ``SetEnv HOME=...``: NNI's worker side keeps everything in ``~/nni-experiments``, so the
  worker writes into tmp_path instead of the real home.
* ``SetEnv PIP_NO_INDEX=1``: NNI runs ``python -m pip install nni --upgrade`` on every worker
  at start; offline, that is a quick no-op instead of a network call that could change
  the project's venv.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from sparta_explore.explore.nni.experiment import ExperimentError, ExperimentRun, run_experiment
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.sweep import load_results

ROOT = Path(__file__).resolve().parents[3]
SPACE = {"sparsity": {"_type": "choice", "_value": [0.5, 0.75, 0.9]},
         "block": {"_type": "choice", "_value": ["32x32", "1x32"]}}
TRIALS = 4


@dataclass(frozen=True)
class Sshd:
    """A running throwaway sshd: where it listens, who may log in with which key, its worker home."""

    port: int
    user: str
    key: Path
    home: Path
    log: Path


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is None and Path("/usr/sbin", name).is_file():
        found = str(Path("/usr/sbin", name))  # sshd lives in sbin, often not on a non-root PATH
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_processes_under(folder: Path) -> list[str]:
    """Kill what still runs from `folder` (NNI's detached trial keeper); returns their command lines."""
    killed = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(folder) in cmd:
            killed.append(cmd)
            with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
                os.kill(proc.info["pid"], signal.SIGKILL)
    return killed


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """An sshd on 127.0.0.1 that lets the current user in with a throwaway key, killed at teardown."""
    daemon, keygen = _tool("sshd"), _tool("ssh-keygen")
    if daemon is None or keygen is None:
        pytest.skip("needs OpenSSH's sshd and ssh-keygen (apt-get install openssh-server)")
    if not Path("/run/sshd").is_dir():  # sshd's privilege separation directory
        if os.geteuid() != 0:
            pytest.skip("sshd needs /run/sshd, which is missing and only root can create")
        Path("/run/sshd").mkdir(mode=0o755)
    folder = tmp_path / "ssh"
    folder.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
    home = tmp_path / "worker_home"
    home.mkdir()
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "PermitRootLogin prohibit-password", "StrictModes no",
        f"PidFile {folder / 'sshd.pid'}", "Subsystem sftp internal-sftp",
        f"SetEnv HOME={home} PIP_NO_INDEX=1", ""]))
    log = folder / "sshd.log"
    with log.open("w") as err:
        proc = subprocess.Popen([daemon, "-D", "-e", "-f", str(config)], stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"sshd could not listen on 127.0.0.1:{port}: {log.read_text().strip()[-500:]}")
            time.sleep(0.1)
        yield Sshd(port, pwd.getpwuid(os.getuid()).pw_name, folder / "client_key", home, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _kill_processes_under(home)


def _checkout(dest: Path) -> Path:
    """A copy of the files a fresh clone of the project has (tracked, or new and not git-ignored).

    The working tree itself also holds git-ignored bulk (.venv-peers/, .hypothesis/) that the
    project's .nniignore does not list, and NNI refuses to upload over 2000 files or 300 MB.
    """
    if shutil.which("git") is None:
        pytest.skip("needs git to list the project's files")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # tracked but deleted in the working tree: not in a clone either
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture
def remote_config(tmp_path: Path, sshd: Sshd, trained: Callable[[str], object], device: object,
                  cache_dir: Path) -> Path:
    """An experiment YAML for the remote platform whose trials take seconds (as test_nni_experiment's)."""
    trained("digits-mlp")  # trained and profiled once here, so no trial's time goes on it
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    code = _checkout(tmp_path / "code")
    command = ("OMP_NUM_THREADS=1 python -m sparta_explore.explore.nni.trial --model digits-mlp --objective latency "
               f"--target 0.5 --finetune-epochs 0 --set batch=8 --runs 3 --warmup 1 --cache-dir {cache_dir} "
               "--quick-profile --compile tune=false")
    machine = {"host": "127.0.0.1", "port": sshd.port, "user": sshd.user, "sshKeyFile": str(sshd.key),
               "pythonPath": str(Path(sys.executable).parent)}
    # one trial at a time: two trials started together ask for parameters in a race, and NNI
    # then files each under the other's record (issue 5726; nni_trial's in-order handshake is
    # local-only), which would make nni_params_matched below False by chance
    config = {"searchSpaceFile": "space.json", "trialCommand": command, "trialCodeDirectory": str(code),
              "trialConcurrency": 1, "maxTrialNumber": TRIALS, "experimentWorkingDirectory": "nni",
              "nniManagerIp": "127.0.0.1",
              "tuner": {"codeDirectory": str(ROOT), "className": "sparta_explore.explore.nni.tuner.ParetoTuner",
                        "classArgs": {"startup": TRIALS, "seed": 0}},
              "trainingService": {"platform": "remote", "machineList": [machine]}}
    path = tmp_path / "remote.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _logs(directory: Path, sshd: Sshd) -> str:
    """NNI's manager log and the sshd log, for a failure message."""
    manager = directory / "log" / "nnimanager.log"
    text = manager.read_text()[-3000:] if manager.is_file() else f"(no {manager})"
    return f"{text}\n--- sshd ---\n{sshd.log.read_text()[-1500:]}"


@pytest.mark.slow  # 80 s: a real sshd and NNI's remote training service (make test-slow)
def test_remote_training_service_runs_trials_over_ssh(remote_config: Path, sshd: Sshd) -> None:
    try:
        outcome = run_experiment(ExperimentRun(remote_config, timeout_s=400, poll_s=1.0, stall_s=90), echo=None)
    except ExperimentError as e:  # e.g. NNI could not log in or upload: sshd says why
        pytest.fail(f"{e}\n--- sshd ---\n{sshd.log.read_text()[-1500:]}")
    assert outcome.counts == {"SUCCEEDED": TRIALS}, _logs(outcome.directory, sshd)
    df = outcome.trials
    assert len(df) == TRIALS and df["nni_trial"].is_unique
    assert load_results(outcome.csv)["nni_trial"].tolist() == df["nni_trial"].tolist()
    space = Space.from_nni(SPACE)
    echoed = [json.loads(p) for p in df["nni_params"]]
    assert all(space.contains(p) for p in echoed)
    assert len({json.dumps(p, sort_keys=True) for p in echoed}) == TRIALS  # the tuner never repeats a point
    # NNI's own record of each trial's parameters agrees with what the trial ran
    assert df["nni_params_matched"].tolist() == [True] * TRIALS
    assert [(p["sparsity"], p["block"]) for p in echoed] == list(zip(df["sparsity"], df["block"]))
    assert (df["machine"].astype(str).str.len() > 0).all()
    assert (df["latency_ms"] > 0).all() and df["workload"].eq("digits-mlp").all()
    # each trial ran on the SSH worker: its output is in the home sshd gave the worker, not the manager's folder
    trials = sshd.home / "nni-experiments" / outcome.id / "environments" / "remote-worker1" / "trials"
    for trial in df["nni_trial"]:
        assert "final: score" in (trials / trial / "trial.stdout").read_text(), trial
    leftover = _kill_processes_under(sshd.home)
    assert not leftover, f"still running after the experiment stopped: {leftover}"
