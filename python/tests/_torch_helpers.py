"""Module-level helpers for the torch tests: spawned DataLoader workers
unpickle them by module name, so they cannot live in a test function."""

import hashlib
import io

import numpy as np
import torch
from PIL import Image


def to_tensor(img):
    """PIL RGB image -> float tensor CxHxW in [0, 1] (no torchvision here)."""
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255


def hashing_loader(fileobj):
    """Reads the whole file object (a Monarch file), returns (image tensor,
    sha256 of the bytes read): the bytes decoded are the bytes hashed."""
    data = fileobj.read()
    with Image.open(io.BytesIO(data)) as img:
        return to_tensor(img.convert("RGB")), hashlib.sha256(data).hexdigest()


def sha256(data):
    return hashlib.sha256(data).hexdigest()
