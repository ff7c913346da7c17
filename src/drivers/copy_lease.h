// CopyLeases: the kernel tells this process before anyone writes to a copy
// it reads, so a hit needs no fstat() to know the copy is unchanged.
//
// Why. Under `placement.verify: first-read` a block is checked against its
// CRC once, and later reads trust it as long as the copy was not modified
// since (copy_integrity.h). Asking the kernel after every read (an fstat of
// the copy's ctime and size) doubles the system calls of a hit, and costs
// more than the read itself for small ones. A read lease (fcntl F_SETLEASE,
// F_RDLCK) turns the question around: any open of the copy for writing, or
// truncate(), by any process, first sends the lease holder a signal and
// waits until the holder lets go. The handler here marks the descriptor
// broken and lets go at once, so the writer goes on, and a read that finds
// the mark after fetching its bytes checks every block as if the copy were
// new to it (CheckedCopy::Read). A write cannot happen before the mark: the
// writer is held in open() until the handler has set it.
//
// Where no lease can be had, the reader falls back to the fstat after every
// read, as before: a copy owned by another user (leases need the owner, or
// CAP_LEASE), a file system without leases (NFS, some FUSE), a copy open
// for writing somewhere, descriptors above 65,535, leases disabled
// (/proc/sys/fs/leases-enable), or a process that already uses the signal
// chosen here (SIGRTMAX - 3) for something else.
//
// Limits. A process that blocks the signal in every thread, or puts its own
// handler in ours' place once Monarch has taken leases, never lets go: a
// writer then waits /proc/sys/fs/lease-break-time (45 s by default) and the
// kernel breaks the lease without the mark. Monarch blocks the signal
// nowhere; checking the handler at every lease would cost a system call per
// open for a program that does that, which none we know does.

#ifndef MONARCH_DRIVERS_COPY_LEASE_H_
#define MONARCH_DRIVERS_COPY_LEASE_H_

namespace monarch::copy_lease {

// Takes a read lease on `fd`, a copy just opened read-only, and clears any
// mark an earlier descriptor of the same number left. False: no lease (see
// above); the caller checks the copy itself. Take it before the fstat()
// that says what the copy is: a write before the lease then shows in that
// fstat, and a write after it breaks the lease.
bool Take(int fd);

// Takes a read lease again on `fd`, a descriptor already in use, and
// leaves its mark as it is. A break since an earlier lease on `fd` must
// stay seen: another thread may trust that lease and read the copy while
// this one retakes (CheckedCopy::Unchanged). Clearing the mark here could
// let those readers serve a copy rewritten after the break: the likely way
// the chaos test once read a flipped byte 3 times, under ASan.
bool TakeAgain(int fd);

// Whether a lease taken on `fd` was broken since: someone opened the copy
// for writing or truncated it. An acquire load; no system call.
bool Broken(int fd);

}  // namespace monarch::copy_lease

#endif  // MONARCH_DRIVERS_COPY_LEASE_H_
