"""Another user's folders in a shared log dir: never written into.

In a world-writable (sticky) log dir another user can make the folders rltrace writes in before
it does: a symbolic link ``perf_tracer -> /her/folder``, or a real ``live/`` of her own.  Each
case plants a real folder or link owned by another uid (the tests run as root in CI, so
``os.chown``/``os.lchown`` to 65534 make it hers), runs rltrace for real, and checks that her
folder stays empty, that ``configure`` names the path, and that one planted after ``configure``
turns only that output off, with one warning, while the loop goes on.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
from conftest import clean_env

import rltrace
from rltrace.logdir.files import (
    GuardedDirs,
    LineFile,
    UnsafeFileError,
    make_folders,
    open_for_append,
    write_atomically,
)
from rltrace.runtime import RUNTIME, Runtime

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="planting another user's folder needs "
                                "root (chown); CI runs as root")


def _logdir(root: Path) -> Path:
    return root / "logs" / "me" / "exp" / "t0"


def _shared_logdir(root: Path) -> Path:
    """A log dir anyone can write to (sticky, like /tmp)."""
    d = _logdir(root)
    d.mkdir(parents=True)
    d.chmod(0o1777)
    return d


def _hers(tmp_path: Path) -> Path:
    """The other user's own folder (what her links point at)."""
    d = tmp_path / "hers"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    d.chmod(0o777)
    return d


def _plant(logdir: Path, rel: str, hers: Path, kind: str) -> Path:
    path = logdir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        path.symlink_to(hers)
        os.lchown(path, NOBODY, NOBODY)
    else:
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
    return path


def _configure(root: Path, **kw: object) -> rltrace.TracerConfig:
    return rltrace.configure(fileroot=str(root), user="me", experiment_name="exp", trial_name="t0",
                             flush_at_exit=False, handle_sigterm=False, **kw)


def _everything_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("kind", ["link", "folder"])
@pytest.mark.parametrize("rel", ["perf_tracer", "session_tracer", "live", "ray", "torch_profiler",
                                 "report", "perf_tracer/actor", "live/actor"])
def test_another_users_folder_or_link_in_a_shared_log_dir_is_refused_at_configure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rel: str, kind: str) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    hers = _hers(tmp_path)
    planted = _plant(_shared_logdir(root), rel, hers, kind)
    what = "symbolic link" if kind == "link" else "folder"
    with pytest.raises(rltrace.ConfigError, match=rf"{rel}'.* is a {what} owned by another user "
                                                  rf"\(uid {NOBODY}\).*Remove it"):
        _configure(root, session_tracer={"enabled": True}, role="actor", live_interval_s=0.01)
    assert not rltrace.is_configured()
    assert _everything_in(hers) == [] and (kind == "folder" or planted.is_symlink())


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_a_traces_folder_planted_after_configure_turns_that_output_off_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        kind: str) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    hers = _hers(tmp_path)
    logdir = _shared_logdir(root)
    _configure(root, session_tracer={"enabled": True}, live_interval_s=0.01)
    assert not (logdir / "perf_tracer").exists()  # the traces file is opened at the first write
    _plant(logdir, "perf_tracer", hers, kind)
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        for i in range(50):
            with rltrace.trace_scope(f"step{i}"):
                pass
            rltrace.flush()
        sid = rltrace.register_session()
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.flush()
        stats = rltrace.diagnostics()["ChromeTraceExporter"]
        rltrace.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "owned by another user" in r.getMessage()]
    assert len(warnings) == 1 and "this output is off" in warnings[0], caplog.text
    assert "perf_tracer" in warnings[0]
    assert _everything_in(hers) == []
    assert stats["refused"] == 1 and stats["lost"] >= 50 and stats["held"] == 0
    # the other outputs go on: the session record is written
    assert (logdir / "session_tracer" / "sessions-r0.jsonl").read_text().count("\n") == 1


def test_a_live_folder_planted_after_configure_is_never_written_into(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    hers = _hers(tmp_path)
    logdir = _shared_logdir(root)
    _configure(root, session_tracer={"enabled": True}, live_interval_s=0.01)
    assert not (logdir / "live").exists()
    _plant(logdir, "live", hers, "folder")
    p = rltrace.runtime.get_pipeline()
    assert p is not None and p.live is not None
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        assert p.live.publish() is False
        assert p.live.publish() is False
        rltrace.shutdown()
    assert _everything_in(hers) == []
    assert caplog.text.count("cannot publish the live state") == 1 and "owned by another user" \
        in caplog.text


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_every_writer_checks_the_folders_below_the_guarded_base_right_before_use(
        tmp_path: Path, kind: str) -> None:
    logdir = _shared_logdir(tmp_path)
    hers = _hers(tmp_path)
    guard = GuardedDirs()
    guard.add(tmp_path / "logs")
    _plant(logdir, "session_tracer", hers, kind)
    target = logdir / "session_tracer" / "role" / "sessions-r0.jsonl"
    with pytest.raises(UnsafeFileError, match="owned by another user"):
        open_for_append(target, guard=guard)
    with pytest.raises(UnsafeFileError, match="owned by another user"):
        write_atomically(logdir / "session_tracer" / "x.json", b"{}", guard=guard)
    with pytest.raises(UnsafeFileError, match="owned by another user"):
        make_folders(logdir / "session_tracer" / "deeper", guard=guard)
    f = LineFile(target, guard=guard)
    assert f.append(b"1\n2\n") is False and f.append(b"3\n") is False
    assert f.refused is not None and f.lost_lines == 3 and f.pending_bytes == 0
    assert _everything_in(hers) == []
    # the user's own link is followed, and her own folders work as before
    mine = tmp_path / "mine"
    mine.mkdir()
    (logdir / "perf_tracer").symlink_to(mine)
    with open_for_append(logdir / "perf_tracer" / "r" / "traces-r0.jsonl", guard=guard) as fh:
        fh.write(b"{}\n")
    assert (mine / "r" / "traces-r0.jsonl").read_bytes() == b"{}\n"


def test_a_file_of_another_user_in_a_guarded_folder_is_refused(tmp_path: Path) -> None:
    logdir = _shared_logdir(tmp_path)
    guard = GuardedDirs()
    guard.add(tmp_path / "logs")
    theirs = logdir / "sessions-r0.jsonl"
    theirs.write_bytes(b"")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafeFileError, match="a file owned by another user"):
        open_for_append(theirs, guard=guard)
    assert theirs.read_bytes() == b""


def test_the_log_dirs_a_runtime_guards_are_its_own_and_outlive_its_pipeline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    logdir = _shared_logdir(root)
    hers = _hers(tmp_path)
    mine = Runtime()
    assert mine.guarded is not RUNTIME.guarded
    _configure(root)
    rltrace.shutdown()
    _plant(logdir, "report", hers, "link")
    target = logdir / "report" / "summary.json"
    # the process's runtime declared its log dir at configure, and still guards it after shutdown
    with pytest.raises(UnsafeFileError, match="owned by another user"):
        write_atomically(target, b"{}", guard=RUNTIME.guarded)
    assert _everything_in(hers) == []
    # another runtime guards only what it configured itself: nothing, here
    assert mine.guarded.base_of(str(logdir)) is None
    assert RUNTIME.guarded.base_of(str(logdir)) == str(root / "logs")


def test_a_forked_child_keeps_its_runtimes_guard_and_refuses_a_folder_planted_after_the_fork(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    root = tmp_path / "root"
    logdir = _shared_logdir(root)
    hers = _hers(tmp_path)
    _configure(root, session_tracer={"enabled": True})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plants her folder, then opens a file below it
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its own deadline, not pytest's
            signal.alarm(30)
            os.close(read)
            _plant(logdir, "session_tracer/child", hers, "folder")
            try:
                open_for_append(logdir / "session_tracer" / "child" / "x.jsonl",
                                guard=RUNTIME.guarded)
            except UnsafeFileError as exc:
                os.write(write, str(exc).encode())
                code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        said = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    rltrace.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert "session_tracer/child is a folder owned by another user" in said
    assert _everything_in(hers) == []


def test_the_stats_writers_refuse_what_another_user_planted_after_configure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tensorboard")
    from rltrace.stats import StatsLogger, setup_logging
    from rltrace.stats.logs import reset_logging

    clean_env(monkeypatch)
    root = tmp_path / "root"
    hers = _hers(tmp_path)
    logdir = _shared_logdir(root)
    _configure(root)
    _plant(logdir, "tensorboard", hers, "folder")
    theirs = hers / "metrics.jsonl"
    theirs.write_bytes(b"")
    (logdir / "metrics.jsonl").symlink_to(theirs)
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        lg = StatsLogger(console=False, otel=False, tensorboard=True)
        lg.commit(0, 0, 0, {"loss": 1.0})  # the loop goes on without them
        lg.close()
    assert lg.sinks == []
    warned = [r.getMessage() for r in caplog.records]
    assert any("the jsonl sink could not start" in m and "symbolic link" in m for m in warned)
    assert any("the tensorboard sink could not start" in m and "owned by another user" in m
               for m in warned), warned
    # the log file: a link at main.log is refused, never written through
    (logdir / "main.log").symlink_to(theirs)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        setup_logging(stream=False)
    reset_logging()
    assert theirs.read_bytes() == b"" and _everything_in(hers) == ["metrics.jsonl"]


def test_outputs_written_by_name_replace_a_planted_link_instead_of_writing_through_it(
        tmp_path: Path) -> None:
    from rltrace.cli.convert import ConvertError, convert

    logdir = _shared_logdir(tmp_path)
    hers = _hers(tmp_path)
    theirs = hers / "target"
    theirs.write_bytes(b"hers\n")
    # rltrace convert: the output's name is a link: refused, her file untouched
    traces = logdir / "perf_tracer" / "traces-r0.jsonl"
    traces.parent.mkdir(parents=True)
    traces.write_bytes(b'{"name":"a","ph":"X","ts":1,"dur":2,"pid":1,"tid":1}\n')
    (logdir / "trace.json").symlink_to(theirs)
    with pytest.raises(ConvertError, match="symbolic link"):
        convert([str(logdir)], str(logdir / "trace.json"), progress=False)
    # rltrace report's files: written to a fresh name and renamed over the link
    from rltrace.analysis.render import write

    (logdir / "report").mkdir()
    (logdir / "report" / "report.json").symlink_to(theirs)
    write({"sessions": {}}, logdir / "report" / "report.json", "json")  # type: ignore[typeddict-item]
    assert not (logdir / "report" / "report.json").is_symlink()
    assert theirs.read_bytes() == b"hers\n"
