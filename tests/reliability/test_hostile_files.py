"""Planted links and hostile names: nothing rltrace writes goes through a link it did not make,
and every name from the config or the environment is checked before it names a folder.

Each case plants its trap in a real directory, runs rltrace for real, and checks that the trap's
target is untouched and that the error names the problem and the fix.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

import rltrace
from rltrace.logdir.files import LineFile, UnsafeFileError, open_for_append, write_atomically

OTHER_UID = 4242  # a uid that is not this test's (the tests run as root in CI: lchown works)


def _logdir(root: Path, user: str = "me") -> Path:
    return root / "logs" / user / "exp" / "t0"


def _configure(root: Path, **kw: object) -> rltrace.TracerConfig:
    return rltrace.configure(fileroot=str(root), user="me", experiment_name="exp", trial_name="t0",
                             flush_at_exit=False, handle_sigterm=False, **kw)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """The file a planted link points at: its bytes must never change."""
    t = tmp_path / "precious.txt"
    t.write_bytes(b"do not touch\n")
    return t


@pytest.mark.parametrize("rel", ["perf_tracer/traces-r0.jsonl", "session_tracer/sessions-r0.jsonl",
                                 "config.yaml", "live/live-r0.json"])
def test_a_link_planted_at_a_log_file_is_refused_at_configure(tmp_path: Path, target: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              rel: str) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    link = _logdir(root) / rel
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    with pytest.raises(rltrace.ConfigError, match=r"symbolic link.*will not write through"):
        _configure(root, session_tracer={"enabled": True})
    assert target.read_bytes() == b"do not touch\n" and link.is_symlink()
    assert not rltrace.is_configured()


def test_a_link_planted_after_configure_is_refused_when_the_file_is_opened(
        tmp_path: Path, target: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "traces-r0.jsonl"
    path.symlink_to(target)
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        open_for_append(path)
    f = LineFile(path)
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        assert f.append(b'{"a": 1}\n') is False  # refused: this output is off, never written through
        assert f.append(b'{"a": 2}\n') is False
    assert caplog.text.count("is a symbolic link") == 1 and "this output is off" in caplog.text
    assert f.pending_bytes == 0 and f.lost_lines == 2 and f.refused is not None
    assert target.read_bytes() == b"do not touch\n"


def test_a_fifo_planted_at_a_log_file_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "sessions-r0.jsonl"
    os.mkfifo(path)
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        open_for_append(path)


def test_whole_file_writes_replace_a_planted_link_and_use_unpredictable_names(
        tmp_path: Path, target: Path) -> None:
    path = tmp_path / "live-r0.json"
    path.symlink_to(target)
    # the old predictable temporary name, planted too
    (tmp_path / f".live-r0.json.{os.getpid()}.tmp").symlink_to(target)
    write_atomically(path, b"{}")
    assert not path.is_symlink() and path.read_bytes() == b"{}"
    assert target.read_bytes() == b"do not touch\n"


def test_live_files_of_a_real_run_never_touch_a_planted_temporary_name(
        tmp_path: Path, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    live = _logdir(root) / "live"
    live.mkdir(parents=True)
    (live / f".live-r0.json.{os.getpid()}.tmp").symlink_to(target)
    _configure(root, session_tracer={"enabled": True}, live_interval_s=0.01)
    sid = rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.flush()
    p = rltrace.runtime.get_pipeline()
    assert p is not None and p.live is not None
    p.live._next = 0.0  # due now: the next cycle publishes
    rltrace.flush()
    rltrace.shutdown()
    assert (live / "live-r0.json").is_file() and target.read_bytes() == b"do not touch\n"


def test_a_link_in_the_log_dirs_path_owned_by_another_user_is_refused(
        tmp_path: Path, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("planting a link owned by another user needs root (lchown); CI runs as root")
    clean_env(monkeypatch)
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "logs").mkdir(parents=True)
    link = root / "logs" / "me"
    link.symlink_to(elsewhere)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(rltrace.ConfigError, match="symbolic link owned by another user"):
        _configure(root)
    assert list(elsewhere.iterdir()) == []


def test_a_folder_of_another_user_in_the_log_dirs_path_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("planting another user's folder needs root (chown); CI runs as root")
    clean_env(monkeypatch)
    root = tmp_path / "root"
    theirs = root / "logs" / "me" / "exp"
    theirs.mkdir(parents=True)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(rltrace.ConfigError, match="belongs to another user"):
        _configure(root)


@pytest.mark.parametrize(("key", "value"), [("user", "../../.."), ("user", "a/b"), ("user", "x\0y"),
                                            ("experiment_name", "e\0"), ("trial_name", ".."),
                                            ("role", "r\0"), ("user", "a\nb"),
                                            ("experiment_name", "e\x1b[2J"), ("trial_name", "t\tx"),
                                            ("role", "r\r")])
def test_every_name_that_makes_a_folder_is_checked_with_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    clean_env(monkeypatch)
    kw = {"fileroot": str(tmp_path), "flush_at_exit": False, key: value}
    with pytest.raises(rltrace.ConfigError, match=f"'{key}'.*without '/' or NUL"):
        rltrace.configure(**kw)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("login", ["../../..", "evil\nname", "tab\tname", "esc\x1b]0;x\x07"])
def test_a_login_name_that_cannot_name_a_folder_is_a_config_error_naming_the_fix(
        tmp_path: Path, login: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
    env.update(LOGNAME=login, USER=login)
    code = ("import rltrace, sys\n"
            "try:\n"
            f"    rltrace.configure(fileroot={str(tmp_path)!r}, flush_at_exit=False)\n"
            "except rltrace.ConfigError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, cwd=tmp_path)
    assert "cannot name the log dir's user folder; set the config key 'user'" in out.stdout, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
