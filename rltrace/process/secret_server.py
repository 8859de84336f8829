"""Secrets for children, served from the parent's memory: nothing on disk outlives the parent.

The parent listens on a Unix socket in Linux's abstract namespace (no file: the kernel removes
the name when the last process holding it ends, SIGKILL and OOM kills included), under a random
128-bit name that only its environment carries.  A child connects, the parent checks the peer's
uid (``SO_PEERCRED``) against its own and answers with the secrets, once per connection.  Where
abstract sockets do not exist (not Linux), the secrets go to an owner-only file in an
owner-only folder named with the parent's pid, removed at exit; a later run removes the folders
whose parent is gone (:func:`remove_stale_files`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets as _random  # the standard library's
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rltrace.logdir.pids import pid_alive

logger = logging.getLogger("rltrace")

#: how the child finds them: ``abstract:<name>`` (a socket) or a file path
ENV = "RLTRACE_PARENT_SECRETS"
_ABSTRACT = "abstract:"
_FOLDER_PREFIX = "rltrace-secrets-"
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
#: folders of the file fallback older than this whose pid is unknown are removed
_STALE_S = 24 * 3600.0


class SecretServer:
    """Serves ``payload`` (JSON) to processes of this uid that connect to its abstract socket."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self._data = json.dumps(payload).encode()
        self.name = f"rltrace-{_random.token_hex(16)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind("\0" + self.name)
            self._sock.listen(16)
        except OSError:
            self._sock.close()
            raise
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="rltrace-secrets", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """What the environment carries: the socket's name, not the secret."""
        return _ABSTRACT + self.name

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    _, uid, _ = _PEERCRED.unpack(
                        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
                    if uid == os.getuid():
                        conn.sendall(self._data)
                except OSError:
                    pass

    def close_inherited(self) -> None:
        """In a forked child: close this process's copy of the socket (the parent serves)."""
        self._sock.close()

    def close(self) -> None:
        """Stop serving; the name is gone with the socket."""
        self._stopped = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def abstract_sockets() -> bool:
    """Whether this platform has Linux's abstract socket namespace."""
    return sys.platform.startswith("linux")


def write_file(payload: dict[str, Any]) -> Path:
    """The fallback: ``payload`` in an owner-only file, in a folder named with this pid."""
    folder = Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-"))  # mode 0700
    path = folder / "otlp-headers.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh)
    return path


def remove_file(path: Path) -> None:
    """Remove a fallback file and its folder (whatever is already gone is fine)."""
    for p in (path, path.parent):
        try:
            p.unlink() if p.is_file() else p.rmdir()
        except OSError:
            pass


def remove_stale_files(now: float | None = None) -> int:
    """Remove the secrets folders this user's earlier runs left in the temp dir: those of a
    process that no longer runs, and unnamed ones (older versions) untouched for a day.
    Returns how many were removed."""
    removed = 0
    now = time.time() if now is None else now
    try:
        entries = list(Path(tempfile.gettempdir()).glob(_FOLDER_PREFIX + "*"))
    except OSError:
        return 0
    for folder in entries:
        try:
            st = folder.lstat()
        except OSError:
            continue
        if st.st_uid != os.getuid() or not folder.is_dir() or folder.is_symlink():
            continue
        pid = _pid_of(folder.name)
        stale = not pid_alive(pid) if pid is not None else now - st.st_mtime > _STALE_S
        if stale:
            for child in folder.iterdir():
                try:
                    child.unlink()
                except OSError:
                    pass
            try:
                folder.rmdir()
                removed += 1
            except OSError:
                pass
    return removed


def _pid_of(name: str) -> int | None:
    head = name[len(_FOLDER_PREFIX):].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def fetch(address: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The secrets the parent serves at ``address`` (``abstract:<name>`` or a file path);
    raises ``OSError`` or ``ValueError`` when they cannot be had."""
    if not address.startswith(_ABSTRACT):
        with open(address) as fh:
            return dict(json.load(fh))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect("\0" + address[len(_ABSTRACT):])
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    if not chunks:
        raise ValueError("the parent refused to serve its secrets (another user?)")
    return dict(json.loads(b"".join(chunks)))
