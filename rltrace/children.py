"""What a spawned child inherits from its parent: the effective config (through the environment)
and the secrets it needs (through a private file whose path is all the environment holds).

OTLP headers from the standard ``OTEL_EXPORTER_OTLP_HEADERS`` are the user's own environment and
reach children as usual; headers given to ``configure`` are written to an owner-only file in an
owner-only directory, replaced on reconfigure and removed at exit.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from .config import ConfigError, TracerConfig, dataclass_to_dict

logger = logging.getLogger("rltrace")

PARENT_CONFIG_ENV = "RLTRACE_PARENT_CONFIG"
#: path of a private (0600) file holding the secrets children need (OTLP headers given in the
#: config); the environment never carries them, and the file goes when the parent exits
PARENT_SECRETS_ENV = "RLTRACE_PARENT_SECRETS"


class ChildConfig:
    """The config this process hands its children, and the secrets file it owns, if any."""

    def __init__(self) -> None:
        self._secrets_files: list[Path] = []  # this process's file, if any

    def publish(self, cfg: TracerConfig, rank: int, world_size: int) -> None:
        """Put the config children inherit into the environment, its secrets in a 0600 file."""
        data = _child_config(cfg, rank, world_size)
        headers = data.get("otlp", {}).pop("headers", None)
        self.remove_secrets()
        if headers:
            folder = Path(tempfile.mkdtemp(prefix="rltrace-secrets-"))  # mode 0700
            path = folder / "otlp-headers.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"otlp": {"headers": headers}}, fh)
            self._secrets_files.append(path)
            os.environ[PARENT_SECRETS_ENV] = str(path)
        os.environ[PARENT_CONFIG_ENV] = json.dumps(data)

    def remove_secrets(self) -> None:
        """Remove this process's secrets file (and its folder) and its path from the environment."""
        os.environ.pop(PARENT_SECRETS_ENV, None)
        while self._secrets_files:
            path = self._secrets_files.pop()
            for p in (path, path.parent):
                try:
                    p.unlink() if p.is_file() else p.rmdir()
                except OSError:
                    pass

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent's file is the parent's to remove."""
        self._secrets_files.clear()


def parent_config() -> dict[str, Any]:
    """The config the parent published, with its secrets; raises :class:`ConfigError` when no
    parent configured rltrace."""
    raw = os.environ.get(PARENT_CONFIG_ENV)
    if not raw:
        raise ConfigError(
            "rltrace.configure_child: no parent configuration in the environment "
            f"({PARENT_CONFIG_ENV}); call rltrace.configure() in the parent before starting "
            "the child, or call rltrace.configure(...) in the child instead"
        )
    data: dict[str, Any] = json.loads(raw)
    secret_headers = _read_parent_secrets().get("otlp", {}).get("headers")
    if secret_headers:
        data.setdefault("otlp", {})["headers"] = secret_headers
    return data


def _child_config(cfg: TracerConfig, rank: int, world_size: int) -> dict[str, Any]:
    data = dataclass_to_dict(cfg)
    data.update(rank=rank, world_size=world_size, per_process_files=True)
    return data


def _read_parent_secrets() -> dict[str, Any]:
    path = os.environ.get(PARENT_SECRETS_ENV)
    if not path:
        return {}
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except (OSError, ValueError) as exc:
        logger.warning("rltrace.configure_child: cannot read the parent's OTLP headers from %s (%s); "
                       "the child exports without them (did the parent exit already?)", path,
                       getattr(exc, "strerror", None) or exc)
        return {}
