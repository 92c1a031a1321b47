"""The caching allocator's model (capture/caching_allocator.py) on request sequences whose reserved bytes follow by
hand from torch 2.13's rules (c10/cuda/CUDACachingAllocator.cpp): rounding, the two pools, segment sizes,
splitting, per-stream caches, merging, expandable segments."""

import pytest

from meshscope.capture.caching_allocator import CachingAllocator, expandable_segments, rounded, segment_size

KiB, MiB = 1 << 10, 1 << 20


def test_sizes_round_to_512_bytes_and_segments_follow_the_request():
    assert [rounded(n) for n in (1, 512, 513, 100_000)] == [512, 512, 1024, 100_352]
    assert [segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB + 1)] == \
        [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]


def test_small_requests_share_one_2_mib_segment():
    a = CachingAllocator()
    for key in range(4):
        a.malloc(key, 100_000)
    assert (a.reserved, a.allocated) == (2 * MiB, 4 * 100_352)
    a.malloc(9, 800 * KiB)  # 2 MiB - 4 x 98 KiB = 1,656 KiB free: fits
    assert a.reserved == 2 * MiB
    a.malloc(10, 900 * KiB)  # 856 KiB left: a second segment
    assert a.reserved == 4 * MiB


def test_a_mid_sized_request_cuts_a_20_mib_segment_that_later_requests_reuse():
    a = CachingAllocator()
    assert a.malloc(0, 3 * MiB // 2)
    assert not a.malloc(1, 3 * MiB // 2)  # from the 18.5 MiB left of the first segment
    assert a.reserved == 20 * MiB


def test_a_large_pool_rest_of_1_mib_is_not_split_off():
    a = CachingAllocator()
    a.malloc(0, 11 * MiB)  # a 12 MiB segment; its 1 MiB rest is not > 1 MiB: the block keeps it
    assert (a.reserved, a.allocated) == (12 * MiB, 12 * MiB)
    a.malloc(1, 512 * KiB)  # small pool: a segment of its own
    assert a.reserved == 14 * MiB


def test_a_block_freed_on_one_stream_is_not_reused_by_another():
    a = CachingAllocator()
    a.malloc(0, 12 * MiB, stream=0)
    a.free(0)
    a.malloc(1, 12 * MiB, stream=1)
    assert a.reserved == 24 * MiB
    a.malloc(2, 12 * MiB, stream=0)  # the cached block of stream 0
    assert a.reserved == 24 * MiB


def test_freed_neighbours_merge_into_one_block():
    a = CachingAllocator()
    for key in range(3):
        a.malloc(key, 3 * MiB // 2)  # three blocks of one 20 MiB segment
    a.free(0)
    a.free(1)  # merged with block 0: 3 MiB free at the segment's start
    assert not a.malloc(3, 5 * MiB // 2) and a.reserved == 20 * MiB
    a.free(2)
    a.free(3)
    assert not a.malloc(4, 19 * MiB)  # the whole segment is one free block again


def test_a_free_segment_too_small_for_a_request_stays_reserved_beside_a_new_one():
    fixed = CachingAllocator()
    fixed.malloc(0, 40 * MiB)
    fixed.malloc(1, 40 * MiB)
    fixed.free(1)
    fixed.malloc(2, 60 * MiB)
    assert fixed.reserved == 140 * MiB and fixed.peak == 140 * MiB


def test_an_expandable_segment_grows_its_free_end_by_20_mib_pages():
    grows = CachingAllocator(expandable=True)
    grows.malloc(0, 40 * MiB)
    grows.malloc(1, 40 * MiB)
    assert grows.reserved == 80 * MiB
    grows.free(1)  # the free end: 40 MiB mapped
    grows.malloc(2, 60 * MiB)  # 20 MiB more pages, one of them
    assert grows.reserved == 100 * MiB
    grows.malloc(3, 30 * MiB)  # 30 MiB past the mapped end: two pages
    assert grows.reserved == 140 * MiB
    grows.free(0)  # a hole of 40 MiB at the start, before block 2
    grows.malloc(4, 35 * MiB)  # fits the hole; the free 10 MiB at the end is not taken
    assert grows.reserved == 140 * MiB


def test_an_expandable_segment_takes_a_free_block_inside_before_its_free_end():
    a = CachingAllocator(expandable=True)
    a.malloc(0, 15 * MiB)  # one page; 5 MiB free at the end
    a.malloc(1, 45 * MiB)  # the free end and two pages more
    a.malloc(2, 10 * MiB)  # a page; 10 MiB free at the end
    a.free(0)  # 15 MiB free at the start
    a.malloc(3, 8 * MiB)  # the end (10 MiB) is the best fit, but it can grow: the 15 MiB inside is taken
    assert a.reserved == 80 * MiB
    a.malloc(4, 12 * MiB)  # 7 MiB left inside, 10 at the end: the end grows by a page
    assert a.reserved == 100 * MiB


def test_a_small_expandable_pool_maps_2_mib_pages():
    a = CachingAllocator(expandable=True)
    a.malloc(0, 600 * KiB)
    a.malloc(1, 600 * KiB)
    a.malloc(2, 900 * KiB)  # 2,100 KiB: two pages
    assert a.reserved == 4 * MiB


def test_a_large_pool_rest_of_more_than_1_mib_is_split_off():
    a = CachingAllocator()
    a.malloc(0, 11 * MiB - 512)  # a 12 MiB segment; 1 MiB + 512 B left: split off, free
    assert a.allocated == 11 * MiB - 512
    assert not a.malloc(1, MiB + 512)  # ... and taken, though a large request
    assert a.reserved == 12 * MiB


def test_a_resize_takes_its_new_block_before_it_frees_the_old_one():
    a = CachingAllocator()
    a.malloc(0, 12 * MiB)
    assert a.resize(0, 12 * MiB)  # the old 12 MiB still held: a second segment
    assert (a.reserved, a.allocated) == (24 * MiB, 12 * MiB)
    a.resize(0, 0)  # resized to nothing (FSDP2 frees its gathered parameters so): the block is cached
    assert not a.resize(0, 12 * MiB) and a.allocated == 12 * MiB


@pytest.mark.parametrize("env, expandable", [
    ({}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128,\texpandable_segments: True"}, True),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:true"}, False),  # torch stops the job: only True and False
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:False", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
     False),
    ({"PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),  # set: it wins
])
def test_expandable_segments_as_torch_reads_its_environment(env, expandable):
    assert expandable_segments(env) is expandable
