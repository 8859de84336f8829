"""Conversion of user values into OTel attribute values and JSON-safe values.

Two stages, so that the exporter's thread never runs the user's code:

* **Record time, on the caller's thread** (:func:`recorded`, :func:`recorded_value`): what the
  caller passed (span ``args``, ``set_attribute``, ``add_event``, ``instant``, phase payloads)
  becomes a value built only of ``str``/``int``/``float``/``bool``/``None``, fresh
  ``list``/``tuple``/``dict`` copies of those (bounded in depth and size), and, for a small
  tensor on an accelerator or a JAX array, a :class:`DeviceValue` whose read-back is library code
  with a bounded wait.  Types are recognised by exact identity (``type(x)``, ``issubclass`` on
  that type, the framework's class looked up in ``sys.modules``), never by ``hasattr`` or
  ``isinstance`` (both can run the object's own code: ``__getattr__``, a ``__class__``
  property, a dead ``weakref.proxy``).  An object of a type not on the documented list is
  recorded as ``<module.Class object at 0x...>``: its ``__str__``/``__repr__`` is never
  called, so one that raises, blocks or never returns can neither break nor stall the loop.
  Nothing here raises.
* **Export time** (:func:`attr_value`, :func:`json_default`, :func:`dumps_line`): recorded
  values become OTel attribute values or JSON; a huge value is truncated with a note of how much
  was cut, never fatal.  These accept any value (a value that was not recorded is made safe
  first), so they are total too.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from enum import Enum
from itertools import islice
from types import MappingProxyType, ModuleType
from typing import Any, Protocol

import orjson

MAX_STRING = 65_536
MAX_SEQUENCE = 256
MAX_DEPTH = 4
SMALL_ARRAY = 16
#: containers nested deeper than this are recorded as ``<list of N items>``
COPY_DEPTH = 8
#: items copied from one list/tuple/dict/set; the rest is noted as ``...<N more items>``
MAX_ITEMS = 1024
#: items copied from one recorded value in all (its nested containers together)
MAX_NODES = 4096
#: longest the exporter waits for one accelerator value to be computed before it writes the
#: value's summary instead
DEVICE_WAIT_S = 0.02
_I64 = 1 << 63

_PLAIN = frozenset((str, int, float, bool, type(None)))
_type_module = type.__dict__["__module__"].__get__
_type_qualname = type.__dict__["__qualname__"].__get__
_type_name = type.__dict__["__name__"].__get__


def utf8(s: str) -> str:
    """``s`` unchanged if it encodes as UTF-8; otherwise lone surrogates escaped (``\\udcff``)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _cap(s: str) -> str:
    s = utf8(s)
    return s if len(s) <= MAX_STRING else s[:MAX_STRING] + f"...<{len(s) - MAX_STRING} more chars>"


def text(value: object, kinds: ValueKinds | None = None) -> str:
    """The text of ``value``, never raising, valid UTF-8 (lone surrogates escaped), size-capped.

    Runs none of the value's own code: plain values, library types on the documented list
    (paths, dates, decimals, ...) and containers of them are written as Python writes them; an
    object of any other type as ``<module.Class object at 0x...>`` (see :func:`recorded`).
    ``kinds``: the memo of types to classify with (see :class:`ValueKinds`).
    """
    return _cap(value if type(value) is str else _as_text(value, kinds))


def _as_text(value: object, kinds: ValueKinds | None) -> str:
    try:
        t = type(value)
        if t in _PLAIN:
            return str(value)  # an int past 4,300 digits raises ValueError: caught below
        r = value.resolve() if type(value) is DeviceValue else \
            _top(value, ValueKinds() if kinds is None else kinds)
        return r if type(r) is str else repr(r)
    except Exception:
        return f"<unprintable {_name_of(type(value))}>"


def _name_of(t: type) -> str:
    """``module.Qualname`` of a type, read from the type itself (no metaclass code runs)."""
    try:
        mod = _type_module(t)
        name = _type_qualname(t)
    except Exception:
        return "?"
    if type(name) is not str:
        name = "?"
    return name if type(mod) is not str or mod == "builtins" else f"{mod}.{name}"


def _marker(value: object) -> str:
    """What an object of a type rltrace does not know is recorded as: its type and identity,
    as ``object.__repr__`` writes them, with none of its own code run."""
    return f"<{_name_of(type(value))} object at {id(value):#x}>"


# ---- record time: the caller's thread ------------------------------------------------------

class _Listable(Protocol):
    """What a device value is read through at export: the framework's own ``tolist``."""

    def tolist(self) -> object: ...


class DeviceValue:
    """A small tensor on an accelerator (its copy to host memory, started asynchronously where
    it was recorded) or a small JAX array (immutable), read at export.

    The caller's thread never waits for the device: it only queues the copy.  The exporter
    reads the value once the device says it is ready, waiting at most ``DEVICE_WAIT_S`` (per
    second, in each thread); a value still not computed by then is written as its summary
    (``Tensor(shape=(), dtype=..., device='cuda:0')``).  The read is the framework's own code
    (``tolist``), never the user's.
    """

    __slots__ = ("_done", "_ready", "_src", "_value", "summary")

    def __init__(self, src: _Listable, ready: Callable[[], object] | None, summary: str) -> None:
        self._src: _Listable | None = src
        self._ready = ready
        self.summary = summary
        self._value: object = summary
        self._done = False

    def resolve(self, wait: bool = True) -> object:
        """The value as numbers (lists of numbers), or its summary; computed once."""
        if self._done:
            return self._value
        src, ready = self._src, self._ready
        value: object = self.summary
        try:
            if src is not None and (ready is None or ready() or (wait and _wait_ready(ready))):
                value = _top(src.tolist(), ValueKinds())  # numbers, in lists: the seed's
            elif not wait:
                return value  # not ready, and this caller may not wait: ask again later
        except Exception:
            value = self.summary
        self._value, self._done, self._src, self._ready = value, True, None, None
        return value

    def __repr__(self) -> str:
        return repr(self.resolve(wait=False))


#: this thread's waiting budget: (start of the current second, seconds of it left to wait)
_WAIT_BUDGET: ContextVar[tuple[float, float]] = ContextVar("rltrace_device_wait_budget",
                                                           default=(0.0, DEVICE_WAIT_S))


def _wait_ready(ready: Callable[[], object]) -> bool:
    """Poll the device's own "done?" flag (it has no wait with a bound) within the budget:
    ``DEVICE_WAIT_S`` of waiting per second in all in one thread, whatever the number of
    values, so a busy GPU costs an export cycle (and a recording thread that runs one) at most
    that."""
    now = time.monotonic()
    start, left = _WAIT_BUDGET.get()
    if now - start >= 1.0:
        start, left = now, DEVICE_WAIT_S
    deadline = now + left
    try:
        while time.monotonic() < deadline:
            time.sleep(0.0005)
            if ready():
                return True
        return False
    finally:
        _WAIT_BUDGET.set((start, max(0.0, deadline - time.monotonic())))


(_K_KEEP, _K_ENUM, _K_STR, _K_INT, _K_FLOAT, _K_BYTES, _K_LIST, _K_TUPLE, _K_DICT, _K_SET,
 _K_FROZENSET, _K_TEXT, _K_DATETIME, _K_NDARRAY, _K_NPSCALAR, _K_TENSOR, _K_JAX, _K_OTHER) = range(18)

_SEED: Mapping[type, int] = MappingProxyType({
    list: _K_LIST, tuple: _K_TUPLE, dict: _K_DICT, set: _K_SET, frozenset: _K_FROZENSET,
    bytes: _K_BYTES, bytearray: _K_BYTES, DeviceValue: _K_KEEP,
    complex: _K_TEXT, range: _K_TEXT, type: _K_TEXT,
    types.FunctionType: _K_TEXT, types.BuiltinFunctionType: _K_TEXT,
})
#: the most types a :class:`ValueKinds` remembers (it is emptied when full)
_MAX_KINDS = 4096

#: the built-in bases a type's values are read through, in the order they are tried
_BUILTIN_BASES: tuple[tuple[type, int], ...] = (
    (str, _K_STR), (int, _K_INT), (float, _K_FLOAT), (bytes, _K_BYTES), (bytearray, _K_BYTES),
    (list, _K_LIST), (tuple, _K_TUPLE), (dict, _K_DICT), (set, _K_SET), (frozenset, _K_FROZENSET))

#: library types whose ``str()`` is written as the value's text (exact types only: a subclass
#: may override ``__str__``), by module; looked up in ``sys.modules`` (never imported here)
_TEXT_TYPES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "pathlib": ("PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath"),
    "decimal": ("Decimal",), "fractions": ("Fraction",), "uuid": ("UUID",),
    "datetime": ("date", "timedelta", "timezone"), "ipaddress": ("IPv4Address", "IPv6Address"),
})


def _module_of(t: type) -> str:
    try:
        mod = _type_module(t)
    except Exception:
        return ""
    return mod if type(mod) is str else ""


class ValueKinds(dict[type, int]):
    """Each type's kind, found once per type: the memo that every value recorded is looked up in
    (``kinds[t]``; a type it lacks is classified by :meth:`__missing__`, and remembered).
    Bounded: emptied when it holds ``_MAX_KINDS`` types.

    The runtime's recorder state holds the one the hot path reads (``STATE.kinds``), handed to
    :func:`recorded` and :func:`recorded_value`; another ``Runtime`` has its own.  A value
    converted at export (:func:`text`, :func:`attr_value`, :func:`dumps_line`) was recorded
    already (plain, containers, :class:`DeviceValue`: the seed's types) or never was: it is
    classified with a memo of that call's own.
    """

    __slots__ = ()

    def __missing__(self, t: type) -> int:
        try:
            kind = _SEED.get(t)
            if kind is None:
                kind = _kind_of(t)
        except Exception:
            kind = _K_OTHER
        if len(self) >= _MAX_KINDS:
            self.clear()
        self[t] = kind
        return kind


def _kind_of(t: type) -> int:
    """The kind of values of type ``t``, by identity and ``issubclass`` on ``t`` itself (C
    code: no ``isinstance``, which reads an instance's ``__class__``, no ``hasattr``)."""
    if issubclass(t, Enum):
        return _K_ENUM
    for base, kind in _BUILTIN_BASES:
        if issubclass(t, base):
            return kind
    mods = sys.modules
    mod = _module_of(t)
    for prefix, library_kind in _LIBRARY_KINDS:
        if mod.startswith(prefix):
            found = library_kind(t, mods)
            if found is not None:
                return found
    names = _TEXT_TYPES.get(mod, ())
    m = mods.get(mod) if names else None
    if m is not None and any(getattr(m, n, None) is t for n in names):
        return _K_TEXT
    return _K_OTHER


def _numpy_kind(t: type, mods: Mapping[str, ModuleType]) -> int | None:
    np = mods.get("numpy")
    if np is None:
        return None
    if issubclass(t, np.ndarray):
        return _K_NDARRAY
    if issubclass(t, np.generic):
        return _K_NPSCALAR
    return _K_TEXT if issubclass(t, np.dtype) else None


def _torch_kind(t: type, mods: Mapping[str, ModuleType]) -> int | None:
    torch = mods.get("torch")
    if torch is None:
        return None
    param = getattr(mods.get("torch.nn.parameter"), "Parameter", None)
    if t is torch.Tensor or (param is not None and t is param):
        return _K_TENSOR
    return _K_TEXT if t is torch.dtype or t is torch.device else None


def _jax_kind(t: type, mods: Mapping[str, ModuleType]) -> int | None:
    impl = getattr(mods.get("jax._src.array"), "ArrayImpl", None)
    return _K_JAX if impl is not None and t is impl else None


def _datetime_kind(t: type, mods: Mapping[str, ModuleType]) -> int | None:
    dt = mods.get("datetime")
    return _K_DATETIME if dt is not None and (t is dt.datetime or t is dt.time) else None


#: (module prefix, how a type of such a module is classified: a kind, or None to go on)
_LIBRARY_KINDS: tuple[tuple[str, Callable[[type, Mapping[str, ModuleType]], int | None]], ...] = (
    ("numpy", _numpy_kind), ("torch", _torch_kind), ("jax", _jax_kind), ("datetime", _datetime_kind))


class _Walk:
    """The state of copying one recorded value: items it may still copy, containers open."""

    __slots__ = ("left", "seen")

    def __init__(self) -> None:
        self.left = MAX_NODES
        self.seen: set[int] = set()


def _top(value: object, kinds: ValueKinds) -> object:
    """One value as :func:`recorded` keeps it (``value`` is not of a plain type)."""
    if type(value) is list:
        if len(value) <= MAX_ITEMS:
            copy = value[:]
            for v in copy:
                if type(v) not in _PLAIN:
                    break
            else:
                return copy
    elif type(value) is tuple and len(value) <= MAX_ITEMS:
        for v in value:
            if type(v) not in _PLAIN:
                break
        else:
            return value  # immutable, and so are its items
    try:
        return _rec(value, 0, None, kinds)
    except Exception:  # a library's own failure (or RecursionError): the value's marker
        try:
            return _marker(value)
        except Exception:
            return "<unrecordable value>"


def _rec(value: object, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    t = type(value)
    if t in _PLAIN:
        return value
    kind = kinds[t]
    if _K_LIST <= kind <= _K_FROZENSET:
        return _container(value, kind, depth, _Walk() if walk is None else walk, kinds)
    return _RECORDERS[kind](value, depth, walk, kinds)


class _Array(Protocol):
    """A numpy array or a JAX array, as read here (library attributes and methods only)."""

    size: int
    ndim: int
    shape: tuple[int, ...]
    dtype: object

    def tolist(self) -> object: ...


class _Device(Protocol):
    type: str


class _Tensor(Protocol):
    """A ``torch.Tensor``, as read here (library attributes and methods only)."""

    layout: object
    device: _Device
    is_quantized: bool
    shape: tuple[int, ...]
    dtype: object

    def numel(self) -> int: ...
    def tolist(self) -> object: ...
    def detach(self) -> _Tensor: ...
    def to(self, device: str, *, non_blocking: bool) -> _Tensor: ...


def _keep(value: object, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    return value  # a DeviceValue: recorded already


def _enum(value: Enum, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    if depth >= COPY_DEPTH:
        return _marker(value)
    return _rec(object.__getattribute__(value, "_value_"), depth + 1, walk, kinds)


def _str(value: str, depth: int, walk: _Walk | None, kinds: ValueKinds) -> str:
    return str.__str__(value)


def _int(value: int, depth: int, walk: _Walk | None, kinds: ValueKinds) -> int:
    return int.__int__(value)


def _float(value: float, depth: int, walk: _Walk | None, kinds: ValueKinds) -> float:
    return float.__float__(value)


def _bytes(value: bytes | bytearray, depth: int, walk: _Walk | None, kinds: ValueKinds) -> str:
    return _bytes_text(value)


def _as_str(value: object, depth: int, walk: _Walk | None, kinds: ValueKinds) -> str:
    return _cap(str(value))  # a library type on the documented list: library code


def _datetime(value: _DateTime, depth: int, walk: _Walk | None, kinds: ValueKinds) -> str:
    tz = value.tzinfo
    dt = sys.modules["datetime"]
    zi = getattr(sys.modules.get("zoneinfo"), "ZoneInfo", None)
    if tz is None or type(tz) is dt.timezone or (zi is not None and type(tz) is zi):
        return str(value)
    return _marker(value)  # a tzinfo of the caller's own: its utcoffset() would run


class _DateTime(Protocol):
    @property
    def tzinfo(self) -> object: ...


def _ndarray(value: _Array, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    if value.size <= SMALL_ARRAY and value.ndim <= COPY_DEPTH:
        return _rec(value.tolist(), depth, walk, kinds)  # numbers (objects of a dtype=object array: as any)
    return f"{_type_name(type(value))}(shape={tuple(value.shape)}, dtype={value.dtype})"


def _npscalar(value: _Item, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    return _rec(value.item(), depth, walk, kinds)


class _Item(Protocol):
    def item(self) -> object: ...


def _torch_tensor(value: _Tensor, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    return _tensor(value, type(value), kinds)


def _jax(value: _Array, depth: int, walk: _Walk | None, kinds: ValueKinds) -> object:
    summary = f"{_type_name(type(value))}(shape={tuple(value.shape)}, dtype={value.dtype})"
    if value.size > SMALL_ARRAY:
        return summary
    # immutable: read at export, once computed (a JAX without is_ready: read at export)
    return DeviceValue(value, getattr(value, "is_ready", None), summary)


def _other(value: object, depth: int, walk: _Walk | None, kinds: ValueKinds) -> str:
    return _marker(value)  # a type not on the documented list: none of its code runs


#: how a value of each kind is recorded, by kind (the containers' kinds, list to frozenset, never
#: come here: :func:`_rec` copies them with :func:`_container`)
_RECORDERS: tuple[Callable[[Any, int, _Walk | None, ValueKinds], object], ...] = (
    _keep, _enum, _str, _int, _float, _bytes, _keep, _keep, _keep, _keep, _keep,
    _as_str, _datetime, _ndarray, _npscalar, _torch_tensor, _jax, _other)


def _tensor(value: _Tensor, t: type, kinds: ValueKinds) -> object:
    """A ``torch.Tensor``: a small one on the CPU as numbers now, a small CUDA one copied to
    host memory asynchronously (read at export), anything else its summary."""
    if value.numel() <= SMALL_ARRAY and value.layout is sys.modules["torch"].strided:
        dev = value.device.type
        if dev == "cpu" and not value.is_quantized:
            try:
                return _rec(value.tolist(), 0, None, kinds)
            except Exception:
                pass  # e.g. a tensor under vmap: its summary
        elif dev == "cuda":
            torch = sys.modules["torch"]
            host = value.detach().to("cpu", non_blocking=True)  # queued on the current stream
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(value.device))
            return DeviceValue(host, done.query, _tensor_summary(value, t))
    return _tensor_summary(value, t)


def _tensor_summary(value: _Tensor, t: type) -> str:
    dev = value.device
    where = "" if dev.type == "cpu" else f", device='{dev}'"
    return f"{_type_name(t)}(shape={tuple(value.shape)}, dtype={value.dtype}{where})"


def _bytes_text(value: bytes | bytearray) -> str:
    with memoryview(value) as mv:
        n = mv.nbytes
        s = repr(mv[:MAX_STRING].tobytes())
    return s if n <= MAX_STRING else s + f"...<{n - MAX_STRING} more bytes>"


_BASES: Mapping[int, type[list[object]] | type[tuple[object, ...]] | type[dict[object, object]]
                | type[set[object]] | type[frozenset[object]]] = MappingProxyType({
    _K_LIST: list, _K_TUPLE: tuple, _K_DICT: dict, _K_SET: set, _K_FROZENSET: frozenset})
_NAMES: Mapping[int, str] = MappingProxyType({
    _K_LIST: "list", _K_TUPLE: "tuple", _K_DICT: "dict", _K_SET: "set", _K_FROZENSET: "frozenset"})
_LOOPS: Mapping[int, str] = MappingProxyType({
    _K_LIST: "[...]", _K_TUPLE: "(...)", _K_DICT: "{...}", _K_SET: "{...}", _K_FROZENSET: "{...}"})


def _container(value: Any, kind: int, depth: int, walk: _Walk, kinds: ValueKinds) -> object:
    """A copy of a list/tuple/dict/set (or subclass: read through the base type's own methods,
    so an overridden ``__iter__``/``items`` never runs), items made safe in turn."""
    base: Any = _BASES[kind]
    n = base.__len__(value)
    vid = id(value)
    seen = walk.seen
    if vid in seen:
        return _LOOPS[kind]  # a container that holds itself, as Python's repr writes it
    if depth >= COPY_DEPTH:
        return f"<{_NAMES[kind]} of {n} items>"
    take = min(n, MAX_ITEMS, max(walk.left, 0))
    walk.left -= take
    seen.add(vid)
    try:
        if kind == _K_DICT:
            return _dict_copy(value, n, take, depth, walk, kinds)
        if kind >= _K_SET:
            return _set_text(base.__iter__(value), kind, n, take, depth, walk, kinds)
        seq = [v if type(v) in _PLAIN else _rec(v, depth + 1, walk, kinds)
               for v in base.__getitem__(value, slice(0, take))]
        if take < n:
            seq.append(f"...<{n - take} more items>")
        return seq if kind == _K_LIST else tuple(seq)
    finally:
        seen.discard(vid)


def _dict_copy(value: dict[object, object], n: int, take: int, depth: int,
               walk: _Walk, kinds: ValueKinds) -> dict[object, object]:
    out: dict[object, object] = {}
    for k, v in islice(dict.items(value), take):
        if type(k) not in _PLAIN:
            k = text(k, kinds)
        out[k] = v if type(v) in _PLAIN else _rec(v, depth + 1, walk, kinds)
    if take < n:
        out["..."] = f"<{n - take} more items>"
    return out


def _set_text(items_of: Iterator[object], kind: int, n: int, take: int, depth: int, walk: _Walk,
              kinds: ValueKinds) -> str:
    items = [_rec(v, depth + 1, walk, kinds) for v in islice(items_of, take)]
    body = ", ".join(map(repr, items)) + (f", ...<{n - take} more items>" if take < n else "")
    if kind == _K_SET:
        return "{" + body + "}" if n else "set()"
    return "frozenset({" + body + "})" if n else "frozenset()"


def _as_dict(args: Any) -> dict[Any, object]:
    """A mapping that is not a ``dict`` (``add_event``'s attributes): a ``dict`` subclass read
    through ``dict``'s own methods, OTel's ``BoundedAttributes`` through its items, anything
    else recorded as its marker (its ``items()`` would be the caller's code)."""
    t = type(args)
    try:
        if issubclass(t, dict):
            return dict.copy(args)
        bounded = getattr(sys.modules.get("opentelemetry.attributes"), "BoundedAttributes", None)
        if bounded is not None and t is bounded:
            return dict(args.items())
    except Exception:
        pass
    return {"attributes": _marker(args)}


def recorded(args: Mapping[Any, object], kinds: ValueKinds) -> dict[Any, object]:
    """A copy of ``args`` safe to hold until export, made where it is recorded; never raises.

    Plain values (str, int, float, bool, None) are kept; anything else is made safe here, on
    the caller's thread, without running the caller's code (see :func:`recorded_value`).  Keys
    that are not plain become their :func:`text`.  ``kinds``: the recorder's memo of types
    (``STATE.kinds``, see :class:`ValueKinds`).
    """
    if type(args) is not dict:
        args = _as_dict(args)
    out = dict(args)
    odd = False
    for k, v in out.items():
        if type(v) not in _PLAIN:
            out[k] = _top(v, kinds)
        if type(k) is not str:
            odd = True
    return _plain_keys(out, kinds) if odd else out


def _plain_keys(out: dict[Any, object], kinds: ValueKinds) -> dict[Any, object]:
    """``out`` with each key that is not plain made its :func:`text` (apart from :func:`recorded`:
    a comprehension there that reads ``kinds`` would make every call pay for a closure cell)."""
    return {(k if type(k) in _PLAIN else text(k, kinds)): v for k, v in out.items()}


def recorded_value(value: object, kinds: ValueKinds) -> object:
    """One value as :func:`recorded` keeps it; never raises, runs none of the value's code.
    ``kinds``: the recorder's memo of types (``STATE.kinds``, see :class:`ValueKinds`).

    * plain values as they are;
    * ``list``/``tuple``/``dict`` (and subclasses, read through the base type: a namedtuple
      becomes a tuple) copied, items made safe in turn: ``COPY_DEPTH`` levels, ``MAX_ITEMS``
      items each, ``MAX_NODES`` in all, the rest noted (``...<N more items>``); a container
      that holds itself ends in ``[...]``; a set becomes its text (``{1, 2}``);
    * enums by their value; subclasses of str/int/float as the base value; bytes as their text;
    * ``numpy.ndarray`` and numpy scalars, ``torch.Tensor``/``Parameter``, JAX arrays: up to
      ``SMALL_ARRAY`` elements as numbers (a CPU tensor now; a CUDA tensor or a JAX array read
      at export, see :class:`DeviceValue`), bigger ones as ``Tensor(shape=..., dtype=...)``;
    * paths, ``datetime`` values (naive, or with a ``timezone``/``ZoneInfo``), ``Decimal``,
      ``Fraction``, ``UUID``, IP addresses, ``complex``, ``range``, torch/numpy dtypes and
      devices, classes and functions: their text (library code);
    * anything else: ``<module.Class object at 0x...>``; its ``__str__``/``__repr__`` never runs.
    """
    return value if type(value) in _PLAIN else _top(value, kinds)


# ---- export time --------------------------------------------------------------------------

def attr_value(value: Any) -> object:
    """Convert ``value`` into an OTel attribute value (str, bool, int, float or a sequence)."""
    # the common cases first, inline (this runs for every attribute); the rest in _other_value
    t = type(value)
    if t is str:
        return utf8(value) if len(value) <= MAX_STRING else text(value)
    if t is bool or t is float:
        return value
    if t is int:
        return value if -_I64 <= value < _I64 else str(value)
    return _other_value(value)


def _other_value(value: object) -> object:
    """:func:`attr_value` past the exact str/bool/int/float types: None, sequences, an
    accelerator value (read now), a mapping (its text), and a value that was not recorded
    (made safe first, as :func:`recorded_value` does: its own code never runs here either)."""
    if value is None:
        return "None"
    if type(value) is tuple or type(value) is list:
        return _sequence_value(value)
    if type(value) is DeviceValue:
        return attr_value(value.resolve())
    if type(value) is dict:
        return text(value)
    return attr_value(recorded_value(value, ValueKinds()))  # plain, list/tuple/dict, DeviceValue


def _sequence_value(value: list[object] | tuple[object, ...]) -> object:
    """A list or tuple as a tuple of converted items when they are all of one scalar type and at
    most ``MAX_SEQUENCE``; otherwise its text (OTel attributes hold only homogeneous sequences;
    nested sequences, a list that holds itself among them, are never descended into)."""
    head = value[:MAX_SEQUENCE]
    if any(type(v) in _CONTAINERS for v in head):
        return text(value)
    items = [attr_value(v) for v in head]
    kinds = {type(v) for v in items}
    if len(kinds) <= 1 and not (kinds & {tuple, list}) and len(value) <= MAX_SEQUENCE:
        return tuple(items)
    return text(value)


_CONTAINERS = (list, tuple, dict)


def flatten_into(out: dict[str, object], prefix: str, mapping: Mapping[Any, object],
                 depth: int = 0) -> None:
    """Flatten nested mappings into ``out`` as ``prefix + key`` (``args.cfg.lr``)."""
    for k, v in mapping.items():
        key = prefix + (k if type(k) is str else text(k))
        if type(v) is dict and depth < MAX_DEPTH:
            flatten_into(out, key + ".", v, depth + 1)
        else:
            try:
                out[key] = attr_value(v)
            except Exception:
                out[key] = f"<unconvertible {_name_of(type(v))}>"


def json_safe(value: Any, depth: int = 0) -> object:
    """A JSON-encodable copy of ``value`` (nested mappings kept, keys made strings)."""
    t = type(value)
    if depth < MAX_DEPTH:
        if t is dict or (t not in _PLAIN and issubclass(t, Mapping)):
            return {text(k): json_safe(v, depth + 1) for k, v in value.items()}
        if t is list or t is tuple:
            return [json_safe(v, depth + 1) for v in value[:MAX_SEQUENCE]]
    return attr_value(value)


def json_default(value: object) -> object:
    """``default=`` hook for orjson: whatever JSON cannot encode becomes an attribute value (an
    accelerator value its numbers, nested lists kept)."""
    try:
        if type(value) is DeviceValue:
            return value.resolve()
        return attr_value(value)
    except Exception:
        return f"<unconvertible {_name_of(type(value))}>"


_OPT = orjson.OPT_NON_STR_KEYS
_dumps = orjson.dumps


def dumps_line(obj: object) -> bytes:
    """``obj`` as compact JSON bytes, whatever it holds.

    String keys and JSON values take orjson's plain call (the common case, and the cheapest);
    non-string keys and values JSON has no form for are written through ``json_default``; what
    orjson still refuses (an int beyond 64 bits, a lone surrogate) is made :func:`json_safe`.
    Every path writes the same bytes for what the plain call accepts.
    """
    try:
        return _dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        return _dumps(obj, default=json_default, option=_OPT)
    except TypeError:
        return _dumps(json_safe(obj), default=json_default, option=_OPT)


def category_name(category: object, default: str = "misc") -> str:
    """The string form of a category (``Category`` enum member or any string)."""
    if category is None:
        return default
    if type(category) is str:
        return category
    if issubclass(type(category), Enum):  # C code on the type: none of the category's runs
        value = object.__getattribute__(category, "_value_")
        return value if type(value) is str else text(value)
    return text(category)
