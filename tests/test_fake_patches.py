"""The fake world's one table of changes to torch (`trace.fake.patches`): every row's targets exist on
the installed torch (a library's row: on the installed library, where it is), in this process and without
installing anything, so a torch that renames one fails here rather than in a user's trace; a fake world's
result names the rows that were active."""

from __future__ import annotations

import pytest
import torch

from meshscope.trace.fake import patches

from .helpers import ROOT, trace_json


@pytest.mark.parametrize("row", patches.PATCHES, ids=[p.name for p in patches.PATCHES])
def test_every_target_exists_on_this_torch(row):
    """A row meant for this torch's release finds its targets; one outside its releases (a torch that moved
    the code it patches: `since`, `until`) finds none, so that a row whose target came back is noticed."""
    if row.library and not patches.present(row):
        pytest.skip(f"not installed: {row.library}")
    if patches.meant_for(row, torch.__version__):
        for target in row.targets:
            assert patches.resolve(target) is not None, target
    else:
        assert not patches.present(row), row.name
    assert row.mode in (patches.FAKE_WORLD, patches.CUDA_MAP, patches.FAKE_TENSORS, patches.MEASURE_CUDA) and row.why \
        and row.read_at


def test_a_row_names_the_releases_it_is_meant_for():
    moved = patches.Patch("moved", (), "test", "2.15", patches.FAKE_WORLD, lambda: None, since="2.15", until="2.17")
    assert [patches.meant_for(moved, v) for v in ("2.13.0+cpu", "2.15.0+cu132", "2.16.1", "2.17.0")] == [
        False, True, True, False]


def test_a_row_whose_target_is_gone_is_not_applied():
    gone = patches.Patch("gone", ("torch.distributed.no_such_function",), "test", "none", patches.FAKE_WORLD,
                         lambda: pytest.fail("installed a row whose target does not exist"))
    assert not patches.present(gone)
    with pytest.raises(AttributeError):
        patches.resolve("torch.distributed.no_such_function")


def test_the_result_names_the_rows_a_fake_world_applied(tmp_path):
    job = [str(ROOT / "tests" / "jobs" / "ddp.py"), "--steps", "1"]
    _, doc = trace_json(tmp_path / "run", "--fake-world", 2, "--ranks", "0", job)
    want = [p.name for p in patches.PATCHES
            if p.mode in patches.modes(fake_tensors=False) and patches.meant_for(p, torch.__version__)
            and (not p.library or patches.present(p))]
    assert doc["fake_world"]["patched"] == want and doc["ranks"][0]["patched"] == want


@pytest.mark.parametrize("size, num", [(10, 4), (9, 6), (8, 8), (3, 8), (0, 4), (1024, 1024), (7, 1)])
def test_fsdp2s_chunks_made_where_read_are_torchs_chunks(size, num):
    """The row "FSDP2's chunks made where read": the lazy list answers what torch's ``_chunk_with_empty`` (the
    oracle, unpatched in this process) returns, chunk by chunk: the same length, and views of the same size,
    storage offset and strides (the padding past torch.chunk's last: empty tensors), on a 2-D parameter along
    dim 0 and dim 1."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from meshscope.trace.fake.tensors import _Chunks

    for dim in (0, 1):
        param = torch.randn((size, 3) if dim == 0 else (3, size))
        want, got = _chunk_with_empty(param, num, dim), _Chunks(param, num, dim)
        assert len(got) == len(want) == num
        for i in (*range(num), -1):
            a, b = want[i], got[i]
            assert (b.shape, b.stride(), b.storage_offset()) == (a.shape, a.stride(), a.storage_offset()), (dim, i)
            assert b.numel() == 0 or b.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
