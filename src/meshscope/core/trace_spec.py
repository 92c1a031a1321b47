"""What a trace directory was asked to hold (`TraceSpec`, ``spec.json``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

@dataclass(frozen=True)
class TraceSpec:
    """What a trace directory was asked to hold (``spec.json``): written by `RunDir.begin` before any
    rank starts, read by the assembler and the doctor."""

    world: int
    command: tuple[str, ...]
    """The script (or ``-m MODULE``) and its arguments."""
    traced: int
    """Ranks this directory should hold (one node's workers; a fake world's chosen ranks)."""
    expected: tuple[int, ...] | None = None
    """Which ranks those are, where known before they start (None: a node of several, whose global ranks
    the rendezvous assigns)."""
    nproc_per_node: int = 1
    nnodes: int = 1
    steps: int | None = None
    timeout: float | None = None
    fake_world: bool = False
    ranks: str | None = None
    """A fake world's ``--ranks`` as given (``auto`` or a list)."""

    def to_json(self) -> dict:
        doc = {"kind": "trace", **{f.name: getattr(self, f.name) for f in fields(self)}}
        doc["command"] = list(self.command)
        doc["expected"] = list(self.expected) if self.expected is not None else None
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TraceSpec:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        values["command"] = tuple(d.get("command", ()))
        values["expected"] = tuple(d["expected"]) if d.get("expected") is not None else None
        values.setdefault("traced", d.get("world", 1))
        return cls(**values)
