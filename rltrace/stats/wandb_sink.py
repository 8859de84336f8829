"""Weights & Biases sink: ``wandb.init`` with AReaL's defaults, ``run.log(row, step=step)``.

Defaults (as AReaL's ``StatsLogger``): ``project`` = experiment name, ``name`` = trial name,
``group`` = ``{experiment}_{trial}``, ``id`` = ``{experiment}_{trial}_{id_suffix}`` with
``resume="allow"`` (a restarted trial continues its run), ``dir`` = ``WANDB_DIR`` or the log
dir, and ``config`` = the full experiment config, rltrace's effective configuration (secrets
redacted) under ``rltrace``, and ``version_info`` (rltrace version and the
git commit, branch and dirty flag of the working directory).  ``mode`` ``"offline"`` writes the
run locally only (``wandb sync`` uploads it later).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rltrace.logdir.files import GuardedDirs, make_folders
from rltrace.stats.sinks import CommitInfo
from rltrace.version import __version__

__all__ = ["WandBConfig", "WandBSink", "version_info"]


@dataclass
class WandBConfig:
    """AReaL's ``WandBConfig`` keys.  ``mode`` ``"disabled"`` (default) turns the sink off."""

    mode: str = "disabled"
    entity: str | None = None
    project: str | None = None
    name: str | None = None
    job_type: str | None = None
    group: str | None = None
    notes: str | None = None
    tags: list[str] | None = None
    config: dict[str, Any] | None = None
    id_suffix: str | None = "train"
    wandb_base_url: str | None = None
    wandb_api_key: str | None = None
    #: where the run's files go; None: ``WANDB_DIR`` or the log dir
    dir: str | None = None
    #: extra ``wandb.init`` keyword arguments
    init_kwargs: dict[str, Any] = field(default_factory=dict)


def _git(args: list[str], cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def version_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """rltrace's version and the git ``commit``/``branch``/``dirty`` of ``cwd`` (None outside git)."""
    where = str(cwd or os.getcwd())
    commit = _git(["rev-parse", "HEAD"], where)
    status = _git(["status", "--porcelain", "--untracked-files=no"], where) if commit else None
    return {
        "rltrace": __version__,
        "commit": commit,
        "branch": _git(["rev-parse", "--abbrev-ref", "HEAD"], where) if commit else None,
        "dirty": bool(status) if status is not None else None,
    }


def _plain_config(cfg: Any) -> Any:
    if cfg is None:
        return {}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if hasattr(cfg, "to_container"):  # omegaconf
        return cfg.to_container(resolve=True)
    if isinstance(cfg, Mapping):
        return dict(cfg)
    return {"value": repr(cfg)}


_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|passwd|credential|headers)$", re.I)


def redact_secrets(value: Any) -> Any:
    """A copy of a (nested) config with secret-looking keys' values replaced by ``<redacted>``.

    Keys ending in api_key / token / secret / password / credential / headers (e.g. AReaL's
    ``stats_logger.wandb.wandb_api_key``, rltrace's ``otlp.headers``) never reach W&B.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {k: ("<redacted>" if isinstance(k, str) and _SECRET_KEY.search(k) and v
                    else redact_secrets(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    return value


_BAD_ID = re.compile(r"[^A-Za-z0-9_.\-]")


class WandBSink:
    """Logs each row to a W&B run at the row's step."""

    name = "wandb"

    def __init__(self, cfg: WandBConfig, *, experiment_name: str, trial_name: str,
                 log_dir: str | Path, exp_config: Any = None,
                 tracer_config: Mapping[str, Any] | None = None,
                 guard: GuardedDirs | None = None) -> None:
        import wandb

        if cfg.wandb_base_url:
            os.environ["WANDB_BASE_URL"] = cfg.wandb_base_url
        if cfg.wandb_api_key and cfg.mode == "online":  # offline runs need no key: never hand it out
            os.environ["WANDB_API_KEY"] = cfg.wandb_api_key
        if cfg.mode == "online" and (cfg.wandb_api_key or cfg.wandb_base_url):
            wandb.login()
        suffix = f"_{cfg.id_suffix}" if cfg.id_suffix else ""
        run_id = _BAD_ID.sub("-", f"{experiment_name}_{trial_name}{suffix}")
        directory = cfg.dir or os.environ.get("WANDB_DIR") or str(log_dir)
        make_folders(directory, guard=guard)  # never another user's folder or link
        config = dict(_plain_config(exp_config))
        config.update(cfg.config or {})
        config = redact_secrets(config)
        if tracer_config is not None:
            config.setdefault("rltrace", dict(tracer_config))
        config["version_info"] = version_info()
        self.run = wandb.init(
            mode=cfg.mode,  # type: ignore[arg-type]  # checked by WandBConfig
            entity=cfg.entity, project=cfg.project or experiment_name,
            name=cfg.name or trial_name, job_type=cfg.job_type,
            group=cfg.group or f"{experiment_name}_{trial_name}", notes=cfg.notes, tags=cfg.tags,
            config=config, id=run_id, resume="allow", dir=directory, **cfg.init_kwargs,
        )

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None:
        self.run.log(dict(row), step=info.step)

    def close(self) -> None:
        self.run.finish()
