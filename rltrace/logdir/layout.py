"""The run's log dir, ``{fileroot}/logs/{user}/{experiment_name}/{trial_name}/``: made, checked
and written safely.

A fileroot may be shared (a team's NFS volume): the ``logs/{user}/...`` folders below it must be
this user's, and none of them a symbolic link someone else planted, or another user could point
this run's files (and what it would write through them) elsewhere.  The same holds for the
folders inside the log dir (``perf_tracer/``, ``session_tracer/``, ``live/``, role folders...):
``configure`` refuses one that is another user's link or folder, and every later open checks
them again right before use (the runtime's :class:`rltrace.logdir.files.GuardedDirs`), so one
planted after ``configure`` turns that output off with a warning instead of being written into.
The log files themselves are opened without following links (:mod:`rltrace.logdir.files`).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from rltrace.config import ConfigError, TracerConfig, log_dir, redacted
from rltrace.logdir.files import GuardedDirs, write_atomically
from rltrace.version import __version__

logger = logging.getLogger("rltrace")


def prepare(cfg: TracerConfig, guard: GuardedDirs) -> Path:
    """Make the log dir (checking the folders from ``logs/{user}`` down), declare its
    ``{fileroot}/logs`` in ``guard`` (the runtime's: its writers check every folder below it at
    each open) and prove it writable; raises :class:`ConfigError` naming the problem and the
    fix."""
    logdir = log_dir(cfg)
    root = Path(cfg.fileroot).expanduser() / "logs"
    try:
        _check_chain(root, logdir)
        guard.add(root)
        logdir.mkdir(parents=True, exist_ok=True)
        _check_chain(root, logdir)  # made by someone else meanwhile?
        probe = logdir / f".rltrace-write-test-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
        _check_no_planted_links(logdir)
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"rltrace config key 'fileroot': cannot write the log dir {str(logdir)!r} "
            f"(fileroot={cfg.fileroot!r}): {exc.strerror or exc}. Set fileroot (or "
            f"RLTRACE_FILEROOT) to a writable directory."
        ) from None
    return logdir


def _check_chain(root: Path, logdir: Path) -> None:
    """Every existing folder from ``{root}/{user}`` down to ``logdir``: not a symbolic link
    another user made, and owned by this user (or root)."""
    me = os.getuid()
    path = root
    for part in logdir.relative_to(root).parts:
        path = path / part
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        if path.is_symlink() and st.st_uid != me:
            raise ConfigError(
                f"rltrace config key 'fileroot': {str(path)!r} in the log dir's path is a symbolic "
                f"link owned by another user (uid {st.st_uid}); rltrace will not follow it. "
                f"Remove it, or set fileroot to a directory of your own.")
        if not path.is_symlink() and st.st_uid not in (me, 0):
            raise ConfigError(
                f"rltrace config key 'fileroot': {str(path)!r} in the log dir's path belongs to "
                f"another user (uid {st.st_uid}), who could replace the files in it. Use a "
                f"fileroot (or user / experiment_name / trial_name) of your own.")


#: the folders of the log dir that hold rltrace's files (each may have a role folder inside)
_FILE_DIRS = ("", "perf_tracer", "session_tracer", "live")
#: every folder rltrace (or a library it drives) writes in the log dir
_OUT_DIRS = (*_FILE_DIRS[1:], "ray", "torch_profiler", "report", "tensorboard")


def _check_folder(path: Path) -> None:
    """``path`` (when it exists) is not another user's link or folder."""
    try:
        st = path.lstat()
    except OSError:
        return
    trusted = (os.geteuid(), 0)
    if st.st_uid in trusted or not (stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return
    what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a folder"
    raise ConfigError(
        f"rltrace config key 'fileroot': {str(path)!r} in the log dir is {what} owned by another "
        f"user (uid {st.st_uid}), who could read or replace what rltrace writes there; rltrace "
        f"will not write into it. Remove it, or set fileroot to a directory of your own.")


def _check_no_planted_links(logdir: Path) -> None:
    """No folder rltrace writes in may be another user's link or folder, and none of the files
    it writes a symbolic link: it would write through it (the exporters refuse both again at
    open, should one appear later)."""
    for sub in _OUT_DIRS:
        folder = logdir / sub
        _check_folder(folder)
        if sub in _FILE_DIRS and folder.is_dir():
            for entry in folder.iterdir():  # role folders
                _check_folder(entry)
    links = []
    for sub in _FILE_DIRS:
        folder = logdir / sub
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            inner = entry.iterdir() if entry.is_dir() and not entry.is_symlink() and sub else ()
            links += [p for p in (entry, *inner) if p.is_symlink()
                      and (p.suffix in (".jsonl", ".json") or p.name == "config.yaml")]
    if links:
        names = ", ".join(str(p) for p in sorted(links)[:5])
        raise ConfigError(
            f"rltrace: {len(links)} of the log dir's file names are symbolic links ({names}); "
            f"rltrace will not write through them. Remove them, or choose another trial_name.")


def write_config(logdir: Path, cfg: TracerConfig, world_size: int, guard: GuardedDirs) -> None:
    """``{logdir}/config.yaml``: the effective config, secrets redacted (rank 0 writes it)."""
    import yaml

    data = redacted(cfg)
    data["world_size"] = world_size
    data["rank"] = None
    text = (f"# effective rltrace {__version__} configuration (secrets redacted)\n"
            + yaml.safe_dump(data, sort_keys=False))
    try:
        write_atomically(logdir / "config.yaml", text.encode(), guard=guard)
    except OSError as exc:
        logger.warning("rltrace: cannot write %s: %s", logdir / "config.yaml", exc)
