"""A map-style torch.utils.data.Dataset that reads files with open(), under a
DataLoader with 4 worker processes.

usage: torch_loader.py fork|spawn ROOT LIST EPOCHS [MARKS]

The fork run reads one file in the parent first, so the workers are forked
from a process that already uses the dataset. Each item is the file's index,
size and digests of the whole file and of 4 KiB from its middle (a second
open and a seek). Prints one line per file and epoch, sorted, nothing that
differs between runs.
"""

import hashlib
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, Dataset


class Files(Dataset):
    def __init__(self, root, names):
        self.root = root
        self.names = names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        path = os.path.join(self.root, self.names[index])
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "rb") as f:
            f.seek(len(data) // 2)
            middle = f.read(4096)
        return (index, len(data), hashlib.sha256(data).hexdigest(),
                hashlib.sha256(middle).hexdigest(), os.getpid())


def main():
    method, root, listing, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    marks = sys.argv[5] if len(sys.argv) > 5 else None
    with open(listing) as f:
        names = [line.rstrip("\n") for line in f if line.strip()]
    torch.set_num_threads(1)
    # 4 workers on a 2-core machine: on purpose.
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    dataset = Files(root, names)
    out = []
    if method == "fork":
        first = dataset[0]  # The parent reads before it forks.
        out.append("parent: %s %d %s" % (names[0], first[1], first[2]))
    workers_seen = set()
    for epoch in range(1, epochs + 1):
        if marks:
            open(os.path.join(marks, str(epoch)), "w").close()
        loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=4,
                            multiprocessing_context=method,
                            generator=torch.Generator().manual_seed(epoch))
        items = {}
        for indices, sizes, digests, middles, pids in loader:
            for i, size, digest, middle, pid in zip(indices.tolist(), sizes.tolist(), digests,
                                                    middles, pids.tolist()):
                items[i] = (size, digest, middle)
                workers_seen.add(pid)
        for i in sorted(items):
            size, digest, middle = items[i]
            out.append("%d %s %d %s %s" % (epoch, names[i], size, digest, middle))
    if marks:
        open(os.path.join(marks, "done"), "w").close()
    sys.stdout.write("\n".join(out) + "\n")
    # Not on stdout (it differs between runs): the workers really were processes.
    print("worker processes: %d (parent %d)" % (len(workers_seen), os.getpid()), file=sys.stderr)
    return 0 if os.getpid() not in workers_seen else 1


if __name__ == "__main__":
    sys.exit(main())
