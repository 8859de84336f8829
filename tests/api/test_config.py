"""Configuration: every accepted source, precedence, errors that name the key, log-dir layout, ranks.

Everything goes through :func:`rltrace.configure` into ``tmp_path`` and is checked on the real
files it writes (log dir, ``config.yaml``, Chrome trace) or on :func:`rltrace.get_config`.
"""

from __future__ import annotations

import getpass
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import clean_env

import rltrace
from rltrace.config import load_config
from rltrace.runtime import get_pipeline
from rltrace.testing import read_jsonl

SECRET = "Bearer sup3r-s3cret-t0ken"


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank variables, OTLP endpoints and stray RLTRACE_* settings of the caller must not leak in."""
    clean_env(monkeypatch)


def configure(tmp_path: Path, config: Any = None, **overrides: Any) -> rltrace.TracerConfig:
    overrides.setdefault("flush_at_exit", False)
    if not (isinstance(config, dict) and "fileroot" in config) and not isinstance(config, (str, Path)):
        overrides.setdefault("fileroot", str(tmp_path))
    return rltrace.configure(config, **overrides)


def traced_names(log_dir: Path, rank: int = 0) -> list[str]:
    """Names of the X events in the rank's Chrome file (after a flush)."""
    path = log_dir / "perf_tracer" / f"traces-r{rank}.jsonl"
    if not path.exists():
        return []
    return [e["name"] for e in read_jsonl(path) if e["ph"] == "X"]


def record(name: str) -> None:
    with rltrace.trace_scope(name):
        pass
    rltrace.flush()


def exporter_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rltrace-exporter" and t.is_alive()]


# ---- config sources ------------------------------------------------------------------------------


def test_dict_config_loads_with_nested_section(tmp_path: Path) -> None:
    cfg = configure(tmp_path, {"experiment_name": "exp-dict", "trial_name": "t7", "save_interval": 4,
                               "session_tracer": {"enabled": True, "flush_threshold": 8}})
    assert rltrace.is_configured()
    assert rltrace.get_config() is cfg
    assert (cfg.experiment_name, cfg.trial_name, cfg.save_interval) == ("exp-dict", "t7", 4)
    assert (cfg.session_tracer.enabled, cfg.session_tracer.flush_threshold) == (True, 8)
    assert get_pipeline().log_dir.parts[-2:] == ("exp-dict", "t7")


def test_tracer_config_dataclass_loads_and_is_not_mutated_by_overrides(tmp_path: Path) -> None:
    mine = rltrace.TracerConfig(experiment_name="exp-dc", save_interval=2, fileroot=str(tmp_path))
    cfg = configure(tmp_path, mine, save_interval=9, session_tracer__enabled=True)
    assert (cfg.experiment_name, cfg.save_interval, cfg.session_tracer.enabled) == ("exp-dc", 9, True)
    assert (mine.save_interval, mine.session_tracer.enabled) == (2, False), "the caller's config changed"


@dataclass
class ForeignSessionTracerConfig:
    """Stands in for AReaL's SessionTracerConfig (same keys, a different class)."""

    enabled: bool = False
    flush_threshold: int = 256


@dataclass
class ForeignPerfTracerConfig:
    """Stands in for AReaL's PerfTracerConfig (same keys, a different class)."""

    experiment_name: str = "areal-exp"
    trial_name: str = "areal-trial"
    fileroot: str = ""
    enabled: bool = True
    save_interval: int = 5
    profile_steps: list[int] | None = None
    session_tracer: ForeignSessionTracerConfig = field(default_factory=ForeignSessionTracerConfig)


def test_foreign_dataclass_with_areal_keys_loads(tmp_path: Path) -> None:
    foreign = ForeignPerfTracerConfig(fileroot=str(tmp_path), profile_steps=[3, 4],
                                      session_tracer=ForeignSessionTracerConfig(enabled=True))
    cfg = rltrace.configure(foreign, flush_at_exit=False)
    assert isinstance(cfg, rltrace.TracerConfig)
    assert (cfg.experiment_name, cfg.trial_name, cfg.fileroot) == ("areal-exp", "areal-trial", str(tmp_path))
    assert (cfg.save_interval, cfg.profile_steps) == (5, [3, 4])
    assert (cfg.session_tracer.enabled, cfg.session_tracer.flush_threshold) == (True, 256)
    record("foreign.ok")
    assert traced_names(get_pipeline().log_dir) == ["foreign.ok"]


def test_yaml_file_with_bare_section_loads(tmp_path: Path) -> None:
    path = tmp_path / "tracer.yaml"
    path.write_text(f"experiment_name: exp-yaml\ntrial_name: bare\nfileroot: {tmp_path}\n"
                    "save_interval: 3\nsession_tracer:\n  enabled: true\n")
    cfg = rltrace.configure(str(path), flush_at_exit=False)
    assert (cfg.experiment_name, cfg.trial_name, cfg.save_interval) == ("exp-yaml", "bare", 3)
    assert cfg.session_tracer.enabled is True
    assert get_pipeline().log_dir == tmp_path / "logs" / getpass.getuser() / "exp-yaml" / "bare"


def test_yaml_file_with_top_level_perf_tracer_section_loads(tmp_path: Path) -> None:
    """Shaped like AReaL's examples/math/gsm8k_grpo.yaml (other sections beside perf_tracer)."""
    path = tmp_path / "gsm8k_grpo.yaml"
    path.write_text(f"""\
experiment_name: gsm8k-grpo
trial_name: trial0
seed: 1
cluster:
  n_nodes: 1
  fileroot: /somewhere/else
actor:
  path: Qwen/Qwen2.5-1.5B-Instruct
  optimizer:
    lr: 1.70e-5
perf_tracer:
  experiment_name: gsm8k-grpo
  trial_name: trial0
  fileroot: {tmp_path}
  enabled: true
  save_interval: 2
  session_tracer:
    enabled: false
""")
    cfg = rltrace.configure(path, flush_at_exit=False)
    assert (cfg.experiment_name, cfg.trial_name, cfg.fileroot) == ("gsm8k-grpo", "trial0", str(tmp_path))
    assert cfg.save_interval == 2 and cfg.session_tracer.enabled is False
    assert rltrace.is_configured()


def test_yaml_interpolations_are_resolved_or_rejected(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k_grpo.yaml"
    path.write_text(f"""\
experiment_name: gsm8k-grpo
trial_name: trial0
cluster:
  fileroot: {tmp_path}
perf_tracer:
  experiment_name: ${{experiment_name}}
  trial_name: ${{trial_name}}
  fileroot: ${{cluster.fileroot}}
  enabled: true
""")
    try:
        cfg = load_config(path)
    except rltrace.ConfigError as exc:
        assert "${" in str(exc)  # rejected, naming the unresolved interpolation
        return
    assert (cfg.experiment_name, cfg.trial_name, cfg.fileroot) == ("gsm8k-grpo", "trial0", str(tmp_path))


# ---- precedence -----------------------------------------------------------------------------------


def test_precedence_is_defaults_then_config_then_env_then_keyword(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = rltrace.TracerConfig()
    cfg = configure(tmp_path, {"experiment_name": "from-config"})
    assert cfg.save_interval == defaults.save_interval and cfg.experiment_name == "from-config"

    cfg = configure(tmp_path, {"save_interval": 2, "session_tracer": {"enabled": False}})
    assert (cfg.save_interval, cfg.session_tracer.enabled) == (2, False)

    monkeypatch.setenv("RLTRACE_SAVE_INTERVAL", "5")
    monkeypatch.setenv("RLTRACE_SESSION_TRACER_ENABLED", "true")
    monkeypatch.setenv("RLTRACE_EXPERIMENT_NAME", "from-env")
    cfg = configure(tmp_path, {"save_interval": 2, "session_tracer": {"enabled": False},
                               "experiment_name": "from-config"})
    assert (cfg.save_interval, cfg.session_tracer.enabled, cfg.experiment_name) == (5, True, "from-env")
    assert get_pipeline().log_dir.parent.name == "from-env"

    cfg = configure(tmp_path, {"save_interval": 2, "session_tracer": {"enabled": False}},
                    save_interval=7, session_tracer__enabled=False)
    assert (cfg.save_interval, cfg.session_tracer.enabled, cfg.experiment_name) == (7, False, "from-env")


def test_keyword_override_reaches_nested_key_without_touching_siblings(tmp_path: Path) -> None:
    cfg = configure(tmp_path, {"session_tracer": {"flush_threshold": 17}}, session_tracer__enabled=True)
    assert (cfg.session_tracer.enabled, cfg.session_tracer.flush_threshold) == (True, 17)


# ---- errors -----------------------------------------------------------------------------------------


def test_unknown_key_is_rejected_with_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(rltrace.ConfigError) as info:
        configure(tmp_path, {"save_intervl": 3})
    msg = str(info.value)
    assert "'save_intervl'" in msg and "did you mean 'save_interval'" in msg
    with pytest.raises(rltrace.ConfigError, match=r"'save_intervl'.*did you mean 'save_interval'"):
        configure(tmp_path, save_intervl=3)


def test_unknown_nested_key_is_rejected_naming_its_full_path(tmp_path: Path) -> None:
    with pytest.raises(rltrace.ConfigError) as info:
        configure(tmp_path, {"session_tracer": {"enabld": True}})
    assert "'session_tracer.enabld'" in str(info.value)
    assert "did you mean" in str(info.value) and "enabled" in str(info.value)
    with pytest.raises(rltrace.ConfigError, match=r"'session_tracer\.enabld'.*did you mean 'enabled'"):
        configure(tmp_path, session_tracer__enabld=True)


def test_nested_unknown_key_suggestion_is_the_quoted_full_path(tmp_path: Path) -> None:
    with pytest.raises(rltrace.ConfigError) as info:
        configure(tmp_path, {"session_tracer": {"enabld": True}})
    assert "did you mean 'session_tracer.enabled'" in str(info.value)


def test_unknown_key_in_yaml_file_names_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("perf_tracer:\n  enabled: true\n  trial_nmae: x\n")
    with pytest.raises(rltrace.ConfigError) as info:
        rltrace.configure(path, flush_at_exit=False)
    assert "'trial_nmae'" in str(info.value) and str(path) in str(info.value)
    assert "did you mean 'trial_name'" in str(info.value)


@pytest.mark.parametrize(
    ("config", "key"),
    [({"save_interval": "abc"}, "save_interval"),
     ({"save_interval": True}, "save_interval"),
     ({"session_tracer": {"enabled": "maybe"}}, "session_tracer.enabled"),
     ({"session_tracer": "on"}, "session_tracer"),
     ({"experiment_name": 12}, "experiment_name"),
     ({"flush_interval_s": "soon"}, "flush_interval_s")],
    ids=["str-for-int", "bool-for-int", "bad-bool", "scalar-for-section", "int-for-str", "str-for-float"],
)
def test_wrong_type_is_rejected_naming_the_key(tmp_path: Path, config: dict[str, Any], key: str) -> None:
    with pytest.raises(rltrace.ConfigError, match=rf"'{key}'"):
        configure(tmp_path, config)


def test_wrong_type_in_yaml_is_rejected_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"fileroot: {tmp_path}\nsave_interval: abc\n")
    with pytest.raises(rltrace.ConfigError, match=r"'save_interval'.*must be an integer"):
        rltrace.configure(path, flush_at_exit=False)


def test_env_values_are_coerced_and_bad_ones_name_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLTRACE_FLUSH_INTERVAL_S", "0.5")
    monkeypatch.setenv("RLTRACE_SESSION_TRACER_ENABLED", "0")
    cfg = configure(tmp_path)
    assert cfg.flush_interval_s == 0.5 and cfg.session_tracer.enabled is False
    monkeypatch.setenv("RLTRACE_SAVE_INTERVAL", "abc")
    with pytest.raises(rltrace.ConfigError) as info:
        configure(tmp_path)
    assert "'save_interval'" in str(info.value) and "RLTRACE_SAVE_INTERVAL" in str(info.value)


def test_unknown_rltrace_env_var_is_ignored_with_a_warning_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stray RLTRACE_* variable must not stop training: configure works and warns once."""
    from rltrace.runtime import RUNTIME

    RUNTIME.env_warned.discard("RLTRACE_SAVE_INTERVL")  # warned once per process
    monkeypatch.setenv("RLTRACE_SAVE_INTERVL", "5")
    with caplog.at_level("WARNING", logger="rltrace"):
        cfg = configure(tmp_path)
    assert cfg.save_interval == 1
    assert rltrace.is_configured()
    messages = [r.getMessage() for r in caplog.records]
    assert any("RLTRACE_SAVE_INTERVL" in m and "did you mean RLTRACE_SAVE_INTERVAL" in m
               for m in messages), messages


@pytest.mark.parametrize(
    ("overrides", "key"),
    [({"save_interval": 0}, "save_interval"),
     ({"session_tracer__flush_threshold": 0}, "session_tracer.flush_threshold"),
     ({"max_queue_size": 0}, "max_queue_size"),
     ({"flush_interval_s": 0}, "flush_interval_s"),
     ({"rank": -1}, "rank"),
     ({"experiment_name": "a/b"}, "experiment_name"),
     ({"trial_name": ""}, "trial_name"),
     ({"otlp__protocol": "carrier-pigeon"}, "otlp.protocol"),
     ({"otlp__max_export_batch_size": 0}, "otlp.max_export_batch_size")],
    ids=lambda v: v if isinstance(v, str) else next(iter(v)),
)
def test_bad_value_is_rejected_naming_the_key(tmp_path: Path, overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(rltrace.ConfigError, match=rf"'{key}'"):
        configure(tmp_path, **overrides)
    assert not rltrace.is_configured()


def test_unwritable_fileroot_is_rejected_naming_fileroot_and_path(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a regular file, not a directory")
    bad = tmp_path / "afile" / "sub"
    with pytest.raises(rltrace.ConfigError) as info:
        rltrace.configure(fileroot=str(bad), flush_at_exit=False)
    assert "'fileroot'" in str(info.value) and str(bad) in str(info.value)
    assert not rltrace.is_configured()


def test_config_path_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(rltrace.ConfigError, match=r"nope\.yaml"):
        rltrace.configure(missing, flush_at_exit=False)


def test_malformed_otlp_headers_error_does_not_leak_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLTRACE_OTLP_HEADERS", SECRET)  # forgot "authorization="
    with pytest.raises(rltrace.ConfigError) as info:
        configure(tmp_path)
    assert "otlp.headers" in str(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [{"save_intervl": 1}, {"save_interval": 0}, "unwritable"],
    ids=["unknown-key", "bad-value", "unwritable-fileroot"],
)
def test_failing_configure_leaves_previous_pipeline_intact(tmp_path: Path, bad: Any) -> None:
    first = configure(tmp_path / "good", {"experiment_name": "good"})
    log_dir = get_pipeline().log_dir
    threads = exporter_threads()
    if bad == "unwritable":
        (tmp_path / "afile").write_text("x")
        bad = {"fileroot": str(tmp_path / "afile" / "sub")}
    else:
        bad = {**bad, "fileroot": str(tmp_path / "other")}
    with pytest.raises(rltrace.ConfigError):
        rltrace.configure(bad, flush_at_exit=False)
    assert rltrace.is_configured()
    assert rltrace.get_config() is first
    assert get_pipeline().log_dir == log_dir
    assert exporter_threads() == threads
    record("still.tracing")
    assert traced_names(log_dir) == ["still.tracing"]
    assert not (tmp_path / "other").exists()


# ---- reconfigure, layout, config.yaml ------------------------------------------------------------


def test_configure_twice_switches_log_dir_and_keeps_one_exporter_thread(tmp_path: Path) -> None:
    configure(tmp_path, experiment_name="one")
    dir_one = get_pipeline().log_dir
    record("before")
    assert len(exporter_threads()) == 1
    configure(tmp_path, experiment_name="two")
    dir_two = get_pipeline().log_dir
    record("after")
    assert dir_one != dir_two
    assert len(exporter_threads()) == 1, [t.name for t in threading.enumerate()]
    assert traced_names(dir_one) == ["before"]
    assert traced_names(dir_two) == ["after"]


def test_spans_open_across_reconfigure_are_not_lost(tmp_path: Path) -> None:
    configure(tmp_path, experiment_name="one")
    dir_one = get_pipeline().log_dir
    with rltrace.trace_scope("closed.before"):
        pass
    configure(tmp_path, experiment_name="two")  # flushes the old pipeline first
    assert traced_names(dir_one) == ["closed.before"]


def test_log_dir_layout_is_fileroot_logs_user_experiment_trial(tmp_path: Path) -> None:
    configure(tmp_path, experiment_name="exp", trial_name="trial-a", user="alice")
    expected = tmp_path / "logs" / "alice" / "exp" / "trial-a"
    assert get_pipeline().log_dir == expected and expected.is_dir()
    record("x")
    assert traced_names(expected) == ["x"]
    configure(tmp_path, experiment_name="exp", trial_name="trial-b")
    assert get_pipeline().log_dir == tmp_path / "logs" / getpass.getuser() / "exp" / "trial-b"


def test_rank0_writes_parseable_config_yaml_with_headers_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(tmp_path, {"experiment_name": "cfg", "save_interval": 3,
                         "otlp": {"headers": {"authorization": SECRET}}})
    path = get_pipeline().log_dir / "config.yaml"
    text = path.read_text()
    assert "s3cret" not in text
    data = yaml.safe_load(text)
    assert data["experiment_name"] == "cfg" and data["save_interval"] == 3
    assert data["fileroot"] == str(tmp_path)
    assert data["otlp"]["headers"] == {"authorization": "<redacted>"}
    assert data["world_size"] == 1
    assert set(data) >= {f for f in rltrace.TracerConfig.__dataclass_fields__}

    monkeypatch.setenv("RLTRACE_OTLP_HEADERS", f"x-api-key={SECRET},other=1")
    configure(tmp_path, trial_name="env-headers")
    assert rltrace.get_config().otlp.headers == {"x-api-key": SECRET, "other": "1"}
    text = (get_pipeline().log_dir / "config.yaml").read_text()
    assert "s3cret" not in text
    assert yaml.safe_load(text)["otlp"]["headers"] == {"x-api-key": "<redacted>", "other": "<redacted>"}


def test_config_yaml_is_written_by_rank0_only(tmp_path: Path) -> None:
    configure(tmp_path, trial_name="r1", rank=1, world_size=2)
    assert get_pipeline().log_dir.is_dir()
    assert not (get_pipeline().log_dir / "config.yaml").exists()
    configure(tmp_path, trial_name="r0", rank=0, world_size=2)
    assert yaml.safe_load((get_pipeline().log_dir / "config.yaml").read_text())["world_size"] == 2


# ---- rank and world size ------------------------------------------------------------------------------


def test_explicit_rank_wins_over_rank_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    rltrace.configure(fileroot=str(tmp_path), rank=3, flush_at_exit=False)
    p = get_pipeline()
    assert (p.rank, p.world_size) == (3, 4)
    record("on.rank3")
    assert traced_names(p.log_dir, rank=3) == ["on.rank3"]
    assert not (p.log_dir / "perf_tracer" / "traces-r1.jsonl").exists()
    events = read_jsonl(p.log_dir / "perf_tracer" / "traces-r3.jsonl")
    (name,) = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert "Rank 3, Process" in name
    assert p.resource.attributes["rl.rank"] == 3 and p.resource.attributes["rl.world_size"] == 4


def test_rank_and_world_size_come_from_env_when_not_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    configure(tmp_path)
    p = get_pipeline()
    assert (p.rank, p.world_size) == (2, 4)
    record("on.rank2")
    assert traced_names(p.log_dir, rank=2) == ["on.rank2"]
    assert not (p.log_dir / "config.yaml").exists()


def test_rank_defaults_to_zero_of_one_without_env(tmp_path: Path) -> None:
    configure(tmp_path)
    p = get_pipeline()
    assert (p.rank, p.world_size) == (0, 1)
    record("solo")
    assert traced_names(p.log_dir, rank=0) == ["solo"]


def test_rltrace_rank_env_var_wins_over_generic_rank_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("RLTRACE_RANK", "5")
    configure(tmp_path)
    assert get_pipeline().rank == 5
    assert get_pipeline().world_size >= 6


def test_export_tuning_is_read_from_config_and_env_and_validated() -> None:
    """The export loop's knobs are configuration: set by key or ``RLTRACE_EXPORT_TUNING_*``, and
    a value that cannot work is refused naming the key."""
    from rltrace.config import ExportTuning, load_config

    assert load_config(env={}).export_tuning == ExportTuning()
    cfg = load_config({"export_tuning": {"help_rate": 0, "shared_gil": False}},
                      env={"RLTRACE_EXPORT_TUNING_CYCLE_MAX": "64"})
    assert (cfg.export_tuning.help_rate, cfg.export_tuning.shared_gil,
            cfg.export_tuning.cycle_max) == (0, False, 64)
    with pytest.raises(rltrace.ConfigError, match=r"'export_tuning\.wake_at'"):
        load_config(env={}, export_tuning__wake_at=0)
    with pytest.raises(rltrace.ConfigError, match=r"'export_tuning\.help_rate'"):
        load_config(env={}, export_tuning__help_rate=-1)
