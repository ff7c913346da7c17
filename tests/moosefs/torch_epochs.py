"""monarch.torch's FileListDataset under a DataLoader with 4 worker processes.

usage: torch_epochs.py CONFIG LIST EPOCHS

Each item is its index, size and the digests of the whole file and of 4 KiB
from its middle. Prints "<epoch> <name> <size> <sha256> <sha256 of the
middle>" per file, sorted by name within each epoch.
"""

import hashlib
import sys
import warnings

import torch

import monarch.torch as mt


def digest(data):
    half = len(data) // 2
    return (len(data), hashlib.sha256(data).hexdigest(),
            hashlib.sha256(data[half:half + 4096]).hexdigest())


def main():
    config, listing, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(listing) as f:
        names = [line.rstrip("\n") for line in f if line.strip()]
    # 4 workers on a 2-core machine: on purpose.
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    torch.set_num_threads(1)
    dataset = mt.FileListDataset(names, config=config, loader=digest)
    indexed = torch.utils.data.Subset(dataset, range(len(dataset)))
    out = []
    for epoch in range(1, epochs + 1):
        loader = torch.utils.data.DataLoader(
            _WithIndex(indexed), batch_size=None, shuffle=True, num_workers=4,
            generator=torch.Generator().manual_seed(epoch))
        lines = {}
        for index, (size, whole, middle) in loader:
            name = names[int(index)]
            lines[name] = "%d %s %d %s %s\n" % (epoch, name, size, whole, middle)
        out.extend(lines[n] for n in sorted(names))
    sys.stdout.write("".join(out))


class _WithIndex(torch.utils.data.Dataset):
    """Items paired with their index, so a shuffled epoch can be checked by name."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return index, self.inner[index]


if __name__ == "__main__":
    main()
