"""Monarch's seeded sampler: one epoch's sample order, rebuilt from a seed.

sampled_indices() computes the order Monarch.announce_sampled_order()
announces, in the same C library (monarch_sampled_epoch); the algorithm is
specified exactly in include/monarch/sampled_order.h, so any front end can
rebuild it. _sampled_order() builds the monarch_sampled_order that both the
announcement and monarch.torch.SeededSampler pass to the library.
"""

import ctypes
import operator

from . import _lib
from ._errors import OK, _raise

# The most epochs one sampled-order announcement covers (the node service's
# bound; kMaxSampledEpochs in monarch/sampled_order.h).
MAX_SAMPLED_EPOCHS = 100


def _unsigned(name, value, bits):
    """`value` as an int in [0, 2**bits): ctypes would wrap a negative or
    too large one silently into another, valid-looking number."""
    value = operator.index(value)
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must be in [0, 2**{bits}), not {value}")
    return value


def _sampled_order(seed, first_epoch, epochs, shuffle, rank, world_size, drop_last):
    """A monarch_sampled_order. The library checks the values against each
    other (rank < world_size, ...) and names the field in its message."""
    return _lib.SampledOrder(
        seed=operator.index(seed) % (1 << 64),
        first_epoch=_unsigned("first_epoch", first_epoch, 64),
        epochs=_unsigned("epochs", epochs, 32),
        rank=_unsigned("rank", rank, 32),
        world_size=_unsigned("world_size", world_size, 32),
        shuffle=1 if shuffle else 0,
        drop_last=1 if drop_last else 0)


def sampled_indices(samples, seed, epoch, shuffle=True, rank=0, world_size=1, drop_last=False):
    """The sample indices (a list of ints, each < samples) that rank `rank`
    of `world_size` reads in epoch `epoch` of a dataset of `samples`
    samples, in order: the order Monarch.announce_sampled_order() announces
    for that epoch, computed by the same C library (monarch_sampled_epoch).

    Like torch's DistributedSampler: a permutation of range(samples) drawn
    from (seed, epoch) (range(samples) itself without shuffle), padded by
    repeating from its start to a multiple of world_size (cut instead with
    drop_last), of which the rank takes every world_size-th position from
    `rank`. The algorithm is specified exactly in monarch/sampled_order.h.
    `seed` is any int, taken modulo 2**64. ValueError names a bad argument
    (samples 0, rank >= world_size, ...)."""
    how = _sampled_order(seed, 0, 1, shuffle, rank, world_size, drop_last)
    samples = _unsigned("samples", samples, 64)
    epoch = _unsigned("epoch", epoch, 64)
    lib = _lib.lib()
    count = ctypes.c_size_t()
    error = ctypes.c_void_p()
    # The size query first, then the indices straight into a buffer of it.
    code = lib.monarch_sampled_epoch(ctypes.byref(how), samples, epoch, None, 0,
                                     ctypes.byref(count), ctypes.byref(error))
    message = _lib.take_string(error.value)
    if code != OK:
        _raise(code, message)
    if count.value == 0:
        return []
    indices = (ctypes.c_uint64 * count.value)()
    code = lib.monarch_sampled_epoch(ctypes.byref(how), samples, epoch, indices, count.value,
                                     ctypes.byref(count), ctypes.byref(error))
    message = _lib.take_string(error.value)
    if code != OK:
        _raise(code, message)
    return list(indices)
