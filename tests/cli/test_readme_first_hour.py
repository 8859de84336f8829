"""A new user's first hour, as the README tells it: a fresh virtualenv, the README's install, and
every command the README shows (demo, report, convert, top --once, demo --live under a
pseudo-terminal), each ending with exit code 0 and no traceback anywhere in its output.

No network: the install takes its packages from a wheelhouse that ``.ci/run`` fills while it
has the package registry (``RLTRACE_WHEELHOUSE``; without one the test skips and says how).
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import time
import venv
from pathlib import Path

import pytest
from conftest import REPO

WHEELHOUSE = os.environ.get("RLTRACE_WHEELHOUSE")
pytestmark = pytest.mark.skipif(
    not WHEELHOUSE or not Path(WHEELHOUSE).is_dir(),
    reason="no wheelhouse for an offline install: set RLTRACE_WHEELHOUSE to a folder filled by "
           "pip download -d DIR setuptools wheel '.[dev]' (.ci/run does this)")

#: the README's install line, as the README shows it (the test checks it is still there)
README_INSTALL = 'pip install -e ".[dev]"'


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out}"
    assert "Traceback" not in out, f"{' '.join(cmd)} printed a traceback:\n{out}"
    return out


def _run_in_pty(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    """``cmd`` with a pseudo-terminal as its stdout and stderr (what a user's shell gives it)."""
    parent, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env,
                            cwd=cwd, start_new_session=True)
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([parent], [], [], 1.0)
            if ready:
                try:
                    data = os.read(parent, 65536)
                except OSError:  # the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(parent)
        if proc.poll() is None:
            proc.kill()
    out = b"".join(chunks).decode(errors="replace")
    assert rc == 0, f"{' '.join(cmd)} exited {rc}:\n{out}"
    assert "Traceback" not in out, f"{' '.join(cmd)} printed a traceback:\n{out}"
    return out


@pytest.fixture(scope="module")
def readme_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh virtualenv with the README's install in it (offline, from the wheelhouse), and the
    environment a user's shell would give its commands: (bin folder, env)."""
    readme = (REPO / "README.md").read_text()
    assert README_INSTALL in readme and "rltrace demo" in readme
    env_dir = tmp_path_factory.mktemp("readme") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLTRACE_", "OTEL_", "PYTHON", "VIRTUAL_ENV", "PIP_", "PHOENIX_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(env_dir),
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELHOUSE), PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([str(bindir / "pip"), "install", "--quiet", "-e", ".[dev]"], env, REPO, timeout=900)
    return bindir, env


@pytest.mark.timeout(1200)
def test_the_readme_install_gives_every_documented_command(
        tmp_path: Path, readme_venv: tuple[Path, dict[str, str]]) -> None:
    bindir, env = readme_venv
    work = tmp_path / "work"
    work.mkdir()
    rltrace = str(bindir / "rltrace")
    out = _run([rltrace, "demo", "--fileroot", str(work), "--steps", "2", "--tasks", "3"], env, work)
    found = re.search(r"logs in (\S+)", out)
    assert found, out
    logdir = Path(found.group(1))
    assert f"rltrace report {logdir}" in out and f"rltrace top {logdir}" in out  # next steps
    _run([rltrace, "report", str(logdir)], env, work)
    assert (logdir / "report" / "report.html").is_file()
    _run([rltrace, "convert", str(logdir), "-o", str(work / "merged.json")], env, work)
    assert (work / "merged.json").stat().st_size > 0
    top = _run([rltrace, "top", str(logdir), "--once"], env, work)
    assert "rltrace top" in top
    live = _run_in_pty([rltrace, "demo", "--live", "--fileroot", str(work / "live"), "--steps", "1",
                        "--tasks", "2", "--samples", "2"], env, work)
    assert "rltrace top" in live and "next:" in live
    for cmd in ("demo", "report", "convert", "top"):
        _run([rltrace, cmd, "--help"], env, work)


#: what the suite may leave in its temp dir at most (the README's venv itself is outside it)
TEMP_BOUND_BYTES = 1 << 30
#: the README's test command, as the README shows it
README_TESTS = "python -m pytest -q"


def _size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.timeout(1800)
def test_the_readme_test_command_in_the_readme_install_passes_or_skips_with_reasons(
        readme_venv: tuple[Path, dict[str, str]]) -> None:
    """The whole suite, as the README runs it, in the README's install (no torch, JAX, Ray, W&B,
    TensorBoard, TRL, verl, Phoenix, Perfetto checker): every test passes, or skips saying what
    it needs; and the suite leaves a bounded amount in its temp dir.  It is the suite's cheap
    half: the tests that need the frameworks are the slow ones, and they skip here."""
    assert README_TESTS in (REPO / "README.md").read_text()
    bindir, env = readme_venv
    # a temp dir of its own with a short path, as a user's is: under this test's tmp_path the
    # inner tests' paths grow past what Chromium's sockets and top's frame widths take
    temp = Path(tempfile.mkdtemp(prefix="rltrace-readme-"))
    try:
        _run_readme_tests(bindir, env, temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _run_readme_tests(bindir: Path, env: dict[str, str], temp: Path) -> None:
    proc = subprocess.run(
        [str(bindir / "python"), "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
         "-o", "tmp_path_retention_policy=failed",  # a passed test's tmp_path is removed as it ends
         "--basetemp", str(temp / "pytest"), "--ignore", str(Path(__file__).resolve().relative_to(REPO))],
        capture_output=True, text=True, env={**env, "TMPDIR": str(temp)}, cwd=REPO, timeout=1700)
    out = proc.stdout + proc.stderr
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    assert proc.returncode == 0, "\n".join(failed) + "\n" + out[-4000:]
    skips = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    for ln in skips:  # "SKIPPED [n] file:line: reason"
        reason = ln.split(": ", 1)[1] if ": " in ln else ""
        assert reason and reason != "unconditional skip", ln
    left = _size(temp)
    assert left < TEMP_BOUND_BYTES, f"the suite left {left / 1e6:.0f} MB in its temp dir"
