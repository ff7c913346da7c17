"""monarch.sampled_indices and Monarch.announce_sampled_order: the library's
seeded sampler against an independent implementation of its specification
(monarch/sampled_order.h), so that any front end can rebuild it."""

import time

import pytest

import monarch

_MASK = (1 << 64) - 1


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class _Generator:
    """SplitMix64 seeded from (seed, epoch), with Lemire's bounded draws,
    written from the header's text alone."""

    def __init__(self, seed, epoch):
        self.state = _mix(_mix(seed) ^ epoch)

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        return _mix(self.state)

    def below(self, bound):
        product = self.next() * bound
        low = product & _MASK
        if low < bound:
            threshold = ((1 << 64) - bound) % bound
            while low < threshold:
                product = self.next() * bound
                low = product & _MASK
        return product >> 64


def reference(samples, seed, epoch, shuffle=True, rank=0, world_size=1, drop_last=False):
    order = list(range(samples))
    if shuffle:
        generator = _Generator(seed, epoch)
        for i in range(samples - 1, 0, -1):
            j = generator.below(i + 1)
            order[i], order[j] = order[j], order[i]
    per_rank = samples // world_size if drop_last else -(-samples // world_size)
    return [order[k % samples] for k in range(rank, per_rank * world_size, world_size)]


@pytest.mark.parametrize("samples", [1, 2, 3, 10, 97, 1000])
@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_library_matches_the_specification(samples, world_size):
    for seed in (0, 42, 2**64 - 1):
        for epoch in (0, 1, 2**40):
            for drop_last in (False, True):
                for rank in {0, world_size // 2, world_size - 1}:
                    args = (samples, seed, epoch, True, rank, world_size, drop_last)
                    assert monarch.sampled_indices(*args) == reference(*args), args
    assert monarch.sampled_indices(samples, 5, 1, shuffle=False) == list(range(samples))


def test_golden_small_case():
    # The same values tests/test_sampled_order.cc pins for C++.
    assert monarch.sampled_indices(10, 42, 0) == [0, 3, 5, 7, 9, 8, 2, 1, 4, 6]
    assert monarch.sampled_indices(10, 42, 1) == [6, 5, 1, 4, 7, 3, 2, 9, 8, 0]
    assert [monarch.sampled_indices(10, 42, 0, rank=r, world_size=3) for r in range(3)] == \
        [[0, 7, 2, 6], [3, 9, 1, 0], [5, 8, 4, 3]]
    assert monarch.sampled_indices(10, 42, 0, rank=2, world_size=3, drop_last=True) == [5, 8, 4]
    # A negative seed is taken modulo 2**64.
    assert monarch.sampled_indices(10, -1, 0) == monarch.sampled_indices(10, 2**64 - 1, 0)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="rank"):
        monarch.sampled_indices(10, 0, 0, rank=3, world_size=3)
    with pytest.raises(ValueError, match="world_size"):
        monarch.sampled_indices(10, 0, 0, world_size=0)
    with pytest.raises(ValueError, match="samples"):
        monarch.sampled_indices(0, 0, 0)
    with pytest.raises(ValueError, match="rank"):
        monarch.sampled_indices(10, 0, 0, rank=-1)  # Not wrapped to 2**32 - 1.
    with pytest.raises(ValueError, match="epoch"):
        monarch.sampled_indices(10, 0, -1)
    with pytest.raises(TypeError):
        monarch.sampled_indices(10, 0, 1.5)
    assert monarch.sampled_indices(2, 0, 0, rank=3, world_size=4, drop_last=True) == []


def test_announce_sampled_order_announces_every_epoch(m):
    files = ["blob.bin", "sub/hello.txt", "array.npy", "image.png", "data.h5"]
    m.announce_sampled_order(files, seed=3, first_epoch=4, epochs=3, rank=1, world_size=2)
    stats = m.stats()
    assert stats["prefetch_announced_files"] == 3 * 3  # 3 epochs of ceil(5 / 2).
    assert stats["prefetch_order_files"] == 3 * 3
    m.wait_for_placement()
    with pytest.raises(ValueError, match="epochs"):
        m.announce_sampled_order(files, seed=3, first_epoch=0,
                                 epochs=monarch.MAX_SAMPLED_EPOCHS + 1)
    with pytest.raises(ValueError, match="files"):
        m.announce_sampled_order([], seed=3, first_epoch=0)
    with pytest.raises(FileNotFoundError):
        m.announce_sampled_order(files + ["nope.bin"], seed=3, first_epoch=0, shuffle=False)
    assert m.stats()["prefetch_announced_files"] == 9  # Nothing more was announced.


def test_announce_sampled_order_through_the_node_service(shared_service):
    files = ["blob.bin", "sub/hello.txt", "array.npy", "image.png", "data.h5", "sub/deeper/x.bin"]
    with monarch.Monarch(shared_service.config) as client:
        client.announce_sampled_order(files, seed=8, first_epoch=0, epochs=4, world_size=1)
        client.wait_for_placement()
        stats = client.stats()
        assert stats["prefetch_announced_files"] == 4 * 6
        assert stats["prefetch_order_files"] == 4 * 6  # Still this client's, until it leaves.
        # The streams fetched every file once, ahead of any read.
        deadline = time.monotonic() + 10
        while client.stats()["prefetch_files"] < 6:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client.stats()["tiers"][-1]["bytes_read"] == sum(
            client.stat(f).st_size for f in files)
