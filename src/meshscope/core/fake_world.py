"""A fake world's section of a trace's result: the ranks it traced of its N and why those (`FakeWorld`),
its classes of ranks (`RankClass`) and the stand-in GPU its torch.cuda answered as (`FakeDevice`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

@dataclass(frozen=True)
class RankClass:
    """A fake world's class of ranks that issue the same ledger up to relabelling."""

    representative: int
    ranks: str
    """The members as ranges: ``0-7,16``."""
    size: int

    def to_json(self) -> dict:
        return {"representative": self.representative, "ranks": self.ranks, "size": self.size}


@dataclass(frozen=True)
class FakeDevice:
    """The stand-in GPU a fake world's torch.cuda answered as (``--fake-device``), where CUDA was mapped."""

    key: str
    """Its ``--fake-device`` name (``H100``)."""
    name: str
    """As ``torch.cuda.get_device_name`` says it (``NVIDIA H100 80GB HBM3``)."""
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    answered: tuple[str, ...] = ()
    """The device and memory queries it answered on any traced rank; memory statistics are zeros."""

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "answered": list(self.answered)}

    @classmethod
    def from_json(cls, d: dict) -> FakeDevice:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        return cls(**{**values, "answered": tuple(d.get("answered", ()))})


@dataclass(frozen=True)
class FakeWorld:
    """What a fake world traced of its N ranks, and why those (``fake_world`` of the result)."""

    world: int
    traced: tuple[int, ...]
    classes: tuple[RankClass, ...] | None
    """One per class of rank 0's group creations (``--ranks auto``); None for the ranks given."""
    how: str
    patched: tuple[str, ...] = ()
    """The changes to torch active on any traced rank (the rows of ``trace.fake.patches``)."""
    device: FakeDevice | None = None
    """The stand-in GPU, where CUDA was mapped to the CPU; None on a machine whose torch has CUDA."""

    def to_json(self) -> dict:
        return {"world": self.world, "traced": list(self.traced), "how": self.how,
                "classes": [c.to_json() for c in self.classes] if self.classes is not None else None,
                "patched": list(self.patched), "device": self.device.to_json() if self.device else None}

    @classmethod
    def from_json(cls, d: dict) -> FakeWorld:
        classes = d.get("classes")
        return cls(d["world"], tuple(d["traced"]), tuple(RankClass(**c) for c in classes) if classes is not None else None,
                   d.get("how", ""), tuple(d.get("patched", ())),
                   FakeDevice.from_json(d["device"]) if d.get("device") else None)
