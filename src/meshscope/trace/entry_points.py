"""Replace one of torch's functions everywhere it is bound.

DeviceMesh imports ``init_process_group``, ``new_group`` and ``split_group`` by name, so replacing
``torch.distributed.new_group`` alone would miss every group a mesh creates; and a library the script
imports may have bound a name earlier still (in a fake world's forked rank, the server imported it
before the rank's patches: `trace.fake.fork_server`). `rebind` replaces a function in every loaded module
that holds that same object; `wrap` does it for c10d's entry points, which the trace wraps to limit
collective timeouts (``--timeout``) and to swap in the fake backend (``--fake-world``). `resolve` finds
the object a dotted torch name names (a fake world's table of changes names its targets so).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from types import FunctionType
from typing import Callable


_places: dict[int, list[tuple[dict, str]]] = {}
"""id of a Python function -> the (module namespace, name) pairs that bound it when the module was
indexed (everything the trace rebinds is a Python function, and so is every replacement)."""
_indexed: set[str] = set()


def index_new_modules() -> None:
    """Index the functions of the modules loaded since the last call: one scan of every module's globals
    (186 ms with a test suite's zygote's 2,168 modules loaded, on this project's box) instead of one per
    rebound function (12-17 ms each, about ten per rank). A process that forks ranks does it before it
    forks (`trace.rank.prefork`), so that each child scans only what it imported since."""
    for module_name, module in list(sys.modules.items()):
        if module_name in _indexed:
            continue
        _indexed.add(module_name)
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):  # a module with a read-only namespace (typing.io) binds nothing
            continue
        for name, value in list(namespace.items()):
            if type(value) is FunctionType:
                _places.setdefault(id(value), []).append((namespace, name))


def rebind(original: Callable, replacement: Callable) -> None:
    """Every loaded module's global bound to `original` now names `replacement`."""
    index_new_modules()
    moved = [(namespace, name) for namespace, name in _places.pop(id(original), [])
             if namespace.get(name) is original]  # still bound to it: an index entry can be stale
    for namespace, name in moved:
        namespace[name] = replacement
    _places.setdefault(id(replacement), []).extend(moved)


def wrap(name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace c10d's `name`, wherever it is bound, by ``make(original)``; nothing if torch lacks it."""
    import torch.distributed.distributed_c10d as c10d

    original = getattr(c10d, name, None)
    if original is not None:
        rebind(original, make(original))


def arguments(original: Callable) -> Callable[[tuple, dict], dict]:
    """``bind(args, kwargs)``: the arguments a call of `original` passed, by name (positional ones too), as
    ``inspect.Signature.bind_partial`` gives them. c10d's entry points take no ``*args``/``**kwargs``, so a
    call that passes no more positions than they have and no name twice binds by zipping (0.7 against 6.3 us
    on this project's box: a fake world of 1,024 ranks creates about 9,000 groups in every rank, each through
    three wrappers); any other call goes through the signature, which raises its TypeError."""
    signature = inspect.signature(original)
    params = signature.parameters.values()
    names = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    known = frozenset(p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY))
    simple = len(known) == len(signature.parameters)

    def bind(args: tuple, kwargs: dict) -> dict:
        if simple and len(args) <= len(names) and kwargs.keys() <= known and kwargs.keys().isdisjoint(names[:len(args)]):
            given = dict(zip(names, args))
            given.update(kwargs)
            return given
        return dict(signature.bind_partial(*args, **kwargs).arguments)
    return bind


def resolve(target: str):
    """The object a dotted torch name names, importing its module; AttributeError/ImportError if absent."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module of {target!r} can be imported")
