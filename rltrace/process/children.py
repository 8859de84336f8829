"""What a spawned child inherits from its parent: the effective config (through the environment)
and the secrets it needs (served from the parent's memory: :mod:`rltrace.process.secret_server`).

OTLP headers from the standard ``OTEL_EXPORTER_OTLP_HEADERS`` are the user's own environment and
reach children as usual; headers given to ``configure`` never reach the environment or a file
that could outlive the parent: the environment holds only where to ask for them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rltrace.config import ConfigError, TracerConfig, dataclass_to_dict, redact_endpoint
from rltrace.process import secret_server

logger = logging.getLogger("rltrace")

PARENT_CONFIG_ENV = "RLTRACE_PARENT_CONFIG"
#: where a child asks for the secrets it needs (OTLP headers given in the config): the name of
#: the parent's abstract socket (or, off Linux, of an owner-only file removed at exit)
PARENT_SECRETS_ENV = secret_server.ENV


class ChildConfig:
    """The config this process hands its children, and how it serves them its secrets."""

    def __init__(self) -> None:
        self._server: secret_server.SecretServer | None = None
        self._file: Path | None = None  # the fallback off Linux

    def publish(self, cfg: TracerConfig, rank: int, world_size: int) -> None:
        """Put the config children inherit into the environment; serve its secrets."""
        data = _child_config(cfg, rank, world_size)
        otlp = data.get("otlp", {})
        secrets: dict[str, Any] = {}
        if otlp.get("headers"):
            secrets["headers"] = otlp["headers"]
        otlp.pop("headers", None)
        endpoint = otlp.get("endpoint")
        if redact_endpoint(endpoint) != endpoint:  # user:password@ in the URL: served, not shown
            secrets["endpoint"] = endpoint
            otlp["endpoint"] = redact_endpoint(endpoint)
        self.remove_secrets()
        if secrets:
            secret_server.remove_stale_files()  # what killed runs of older versions left
            payload = {"otlp": secrets}
            if secret_server.abstract_sockets():
                self._server = secret_server.SecretServer(payload)
                os.environ[PARENT_SECRETS_ENV] = self._server.address
            else:
                self._file = secret_server.write_file(payload)
                os.environ[PARENT_SECRETS_ENV] = str(self._file)
        os.environ[PARENT_CONFIG_ENV] = json.dumps(data)

    def remove_secrets(self) -> None:
        """Stop serving the secrets (and remove the fallback file) and forget where they were."""
        os.environ.pop(PARENT_SECRETS_ENV, None)
        server, self._server = self._server, None
        if server is not None:
            server.close()
        path, self._file = self._file, None
        if path is not None:
            secret_server.remove_file(path)

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent serves its secrets; the inherited socket is closed here
        (without shutting it down: that would stop the parent's), so it never outlives the
        parent in this child."""
        server, self._server = self._server, None
        if server is not None:
            server.close_inherited()
        self._file = None


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
    secret = _read_parent_secrets().get("otlp", {})
    for key in ("headers", "endpoint"):
        if secret.get(key):
            data.setdefault("otlp", {})[key] = secret[key]
    return data


def _child_config(cfg: TracerConfig, rank: int, world_size: int) -> dict[str, Any]:
    data = dataclass_to_dict(cfg)
    data.update(rank=rank, world_size=world_size, per_process_files=True)
    return data


def _read_parent_secrets() -> dict[str, Any]:
    address = os.environ.get(PARENT_SECRETS_ENV)
    if not address:
        return {}
    try:
        return secret_server.fetch(address)
    except (OSError, ValueError) as exc:
        logger.warning("rltrace.configure_child: cannot get the parent's OTLP headers from %s (%s); "
                       "the child exports without them (did the parent exit already?)", address,
                       getattr(exc, "strerror", None) or exc)
        return {}
