"""Finding a job's Flight Recorder dumps and decoding them without running anything they contain.

torch writes one file per rank at ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE``, alias
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default ``/tmp/nccl_trace_rank_``): a pickle from
``_dump_fr_trace()`` / ``_dump_nccl_trace()``, or JSON from ``_dump_fr_trace_json()`` (a ``.json`` file
beside it, if the job wrote one). The doctor is given a directory of such files, the prefix itself
(the default location mixes jobs, so a prefix picks one), or a trace directory holding them under
``fr/``.

A pickle can run code on load. A real dump is plain dicts, lists, tuples, strings, numbers and None:
measured on torch 2.13 gloo dumps, whose opcodes name no global at all (the recorder builds generic
``c10::List``/``c10::Dict`` values, never typed lists that the TorchScript pickler would tag with a
``torch.jit._pickle`` global). So `RestrictedUnpickler` refuses every global and every persistent id:
a pickle that would call ``os.system`` through ``__reduce__`` fails before anything is called.
JSON is preferred where both exist, since it needs no such care.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

from ..core.errors import UsageError

FR_SUBDIR = "fr"
"""Where a trace directory keeps its dumps (``TORCH_FR_DUMP_TEMP_FILE=RUN_DIR/fr/rank_``)."""

_RANKED = re.compile(r"^(?P<stem>.*?)(?P<rank>\d+)(?P<json>\.json)?$")


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only pickle's own containers and scalars: no global is ever looked up."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused global {module}.{name}: a Flight Recorder dump holds none")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"refused persistent id {pid!r}: a Flight Recorder dump holds none")


def decode(path: Path) -> dict:
    """One dump file as the dict torch wrote; UsageError (one line, naming the file) if it is not one."""
    data = path.read_bytes()
    try:
        doc = json.loads(data) if path.suffix == ".json" else RestrictedUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError,
            OverflowError, MemoryError) as exc:
        kind = "JSON" if path.suffix == ".json" else "pickle"
        raise UsageError(f"{path} is not a readable Flight Recorder dump ({kind}, {len(data)} bytes: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated'})") from None
    if not isinstance(doc, dict) or "version" not in doc or "entries" not in doc and "pg_config" not in doc:
        raise UsageError(f"{path} is not a Flight Recorder dump: expected a dict with 'version' and 'entries', "
                         f"got {type(doc).__name__}{' with keys ' + str(sorted(doc)[:6]) if isinstance(doc, dict) else ''}")
    return doc


def _ranked(files, stem: str | None) -> dict[int, Path]:
    """rank -> file among `files` named ``<stem><rank>`` or ``<stem><rank>.json`` (JSON preferred)."""
    out: dict[int, Path] = {}
    stems: dict[str, list[int]] = {}
    for path in files:
        m = _RANKED.match(path.name)
        if not m or not path.is_file() or (stem is not None and m["stem"] != stem):
            continue
        stems.setdefault(m["stem"], []).append(int(m["rank"]))
        rank = int(m["rank"])
        if rank not in out or m["json"]:
            out[rank] = path
    if stem is None and len(stems) > 1:
        raise UsageError(f"{Path(next(iter(files))).parent} holds dumps of several prefixes {sorted(stems)}: "
                         f"name one, e.g. meshscope doctor {Path(next(iter(files))).parent / min(stems)}")
    return out


def locate(path: Path) -> dict[int, Path] | None:
    """rank -> dump file for a dump directory, a trace directory with ``fr/``, or a dump prefix; None when
    `path` holds no dump at all (a run directory with flight logs only)."""
    path = Path(path)
    if path.is_dir():
        where = path / FR_SUBDIR if (path / FR_SUBDIR).is_dir() else path
        found = _ranked(sorted(where.iterdir()), None)
        return found or None
    if path.parent.is_dir():
        found = _ranked(sorted(path.parent.iterdir()), path.name)
        if found:
            return found
    raise UsageError(f"{path} does not exist, and it is not the prefix of any Flight Recorder dump "
                     f"(files named {path.name}<rank>)")

