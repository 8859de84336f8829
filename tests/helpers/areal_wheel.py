"""Load AReaL's *released* ``perf_tracer`` and ``stats_tracker`` modules from the ``areal`` wheel.

The compatibility tests run one scripted workload through AReaL's real code and through
rltrace and compare the outputs.  The wheel is what ``pip download --no-deps areal==1.0.4``
fetches (``.ci/run`` does that and exports ``RLTRACE_AREAL_WHEEL``).  Only the two modules
under test are AReaL's code as released; the modules they import that have nothing to do
with tracing are small stand-ins, because the rest of AReaL (hydra, uvloop, the inference
engines) does not install here:

- ``areal.api.cli_args``: only ``PerfTracerConfig`` and ``SessionTracerConfig``, whose class
  definitions are taken verbatim from the wheel's ``cli_args.py`` (parsed with ``ast``);
- ``areal.utils.logging``: ``getLogger`` from the standard library;
- ``areal.infra.platforms``: a CPU ``current_platform`` (never initialised);
- ``areal.utils.seqpack``: ``flat2d`` (flatten one level).

The stand-ins live under the ``areal`` package name in ``sys.modules`` only inside
:func:`areal_modules` and are removed again afterwards.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import importlib.util
import logging
import os
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

AREAL_VERSION = "1.0.4"
WHEEL_ENV = "RLTRACE_AREAL_WHEEL"
_CONFIG_CLASSES = ("SessionTracerConfig", "PerfTracerConfig")


def find_wheel() -> Path | None:
    """The areal wheel named by ``RLTRACE_AREAL_WHEEL`` (a file or a folder holding it)."""
    where = os.environ.get(WHEEL_ENV)
    if not where:
        return None
    p = Path(where)
    if p.is_dir():
        found = sorted(glob.glob(str(p / f"areal-{AREAL_VERSION}-*.whl")))
        return Path(found[-1]) if found else None
    return p if p.is_file() else None


def skip_reason() -> str | None:
    """None when the wheel is available, else why the comparison cannot run."""
    if find_wheel() is None:
        return (f"AReaL's released wheel is not available: set {WHEEL_ENV} to the file from "
                f"'pip download --no-deps areal=={AREAL_VERSION}' (.ci/run does this)")
    try:
        import orjson  # noqa: F401
        import torch  # noqa: F401  (AReaL's modules import torch)
    except ImportError as exc:  # pragma: no cover - CI installs both
        return f"AReaL's modules need {exc.name}"
    return None


def _config_source(cli_args: str) -> str:
    tree = ast.parse(cli_args)
    wanted = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in _CONFIG_CLASSES}
    missing = set(_CONFIG_CLASSES) - set(wanted)
    if missing:
        raise RuntimeError(f"areal's cli_args.py has no {sorted(missing)}")
    lines = cli_args.splitlines()
    parts = []
    for name in _CONFIG_CLASSES:  # decorators included: the class exactly as released
        node = wanted[name]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        parts.append("\n".join(lines[first - 1:node.end_lineno]))
    header = ("from __future__ import annotations\n"
              "from dataclasses import dataclass, field\n"
              "MISSING = '???'  # omegaconf.MISSING\n\n")
    return header + "\n\n".join(parts) + "\n"


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@contextlib.contextmanager
def areal_modules() -> Iterator[types.SimpleNamespace]:
    """Yield ``perf_tracer``, ``stats_tracker`` and ``cli_args`` loaded from the wheel."""
    wheel = find_wheel()
    if wheel is None:
        raise RuntimeError(skip_reason() or "no wheel")
    saved = {k: v for k, v in sys.modules.items() if k == "areal" or k.startswith("areal.")}
    for k in saved:
        del sys.modules[k]
    with zipfile.ZipFile(wheel) as zf:
        sources = {n: zf.read(f"areal/{n}").decode() for n in
                   ("utils/perf_tracer.py", "utils/stats_tracker.py", "api/cli_args.py")}
    try:
        cli_args = _module("areal.api.cli_args")
        platform = types.SimpleNamespace(is_initialized=lambda: False, device_type="cpu")
        stubs = {
            "areal": _module("areal", __path__=[]),
            "areal.api": _module("areal.api", __path__=[]),
            "areal.api.cli_args": cli_args,
            "areal.utils": _module("areal.utils", __path__=[]),
            "areal.utils.logging": _module("areal.utils.logging", getLogger=logging.getLogger),
            "areal.utils.seqpack": _module(
                "areal.utils.seqpack", flat2d=lambda xs: [x for sub in xs for x in sub]),
            "areal.infra": _module("areal.infra", __path__=[]),
            "areal.infra.platforms": _module("areal.infra.platforms", current_platform=platform),
        }
        sys.modules.update(stubs)
        exec(compile(_config_source(sources["api/cli_args.py"]), "areal/api/cli_args.py", "exec"),
             cli_args.__dict__)
        loaded = {}
        for short in ("perf_tracer", "stats_tracker"):
            name = f"areal.utils.{short}"
            origin = f"{wheel}!areal/utils/{short}.py"
            spec = importlib.util.spec_from_loader(name, loader=None, origin=origin)
            assert spec is not None
            mod = importlib.util.module_from_spec(spec)
            mod.__file__ = origin
            sys.modules[name] = mod
            exec(compile(sources[f"utils/{short}.py"], mod.__file__, "exec"), mod.__dict__)
            setattr(stubs["areal.utils"], short, mod)
            loaded[short] = mod
        yield types.SimpleNamespace(cli_args=cli_args, **loaded)
    finally:
        for k in [k for k in sys.modules if k == "areal" or k.startswith("areal.")]:
            del sys.modules[k]
        sys.modules.update(saved)
