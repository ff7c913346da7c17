"""Pillow on real image files.

usage: images.py write DIR   (JPEG, PNG and a few other formats; no preload)
       images.py read DIR    (one line per file and check)

`read` opens every file with Image.open(path) and load()s it (Pillow's own
file calls: buffered reads and seeks, and mmap for uncompressed formats such
as PPM and BMP), and prints the format, mode, size and a digest of the
decoded pixels and of the raw bytes; then decodes the raw bytes from memory
and says whether the pixels agree, and for JPEG decodes a draft (DCT-scaled).
"""

import hashlib
import io
import os
import random
import sys

from PIL import Image


def h(data):
    return hashlib.sha256(bytes(data)).hexdigest()


def picture(rng, w, h_, mode="RGB"):
    """A gradient with noise and a few blocks: compresses like a photo, not like noise."""
    base = Image.linear_gradient("L").resize((w, h_))
    noise = Image.frombytes("L", (w, h_), rng.randbytes(w * h_))
    channels = [Image.blend(base.rotate(90 * i), noise, 0.3 + 0.1 * i) for i in range(3)]
    img = Image.merge("RGB", channels)
    for _ in range(6):
        x, y = rng.randrange(w), rng.randrange(h_)
        img.paste((rng.randrange(256), rng.randrange(256), rng.randrange(256)),
                  (x, y, min(w, x + rng.randrange(5, 60)), min(h_, y + rng.randrange(5, 60))))
    return img.convert(mode)


def write(directory):
    rng = random.Random(7)
    os.makedirs(os.path.join(directory, "jpeg"), exist_ok=True)
    os.makedirs(os.path.join(directory, "png"), exist_ok=True)
    os.makedirs(os.path.join(directory, "other"), exist_ok=True)
    for i in range(10):
        w, hh = 96 + 53 * i, 64 + 41 * i
        img = picture(rng, w, hh)
        kwargs = {"quality": 70 + 3 * i}
        if i % 3 == 1:
            kwargs["progressive"] = True
        if i % 3 == 2:
            kwargs["subsampling"] = 0
        img.save(os.path.join(directory, "jpeg", "img_%02d.jpg" % i), "JPEG", **kwargs)
    for i, mode in enumerate(["RGB", "RGBA", "L", "P", "I;16", "1", "LA", "RGB"]):
        w, hh = 80 + 67 * i, 70 + 37 * i
        img = picture(rng, w, hh)
        if mode == "P":
            img = img.quantize(64)
        elif mode == "I;16":
            img = img.convert("I").point(lambda v: v * 211).convert("I;16")
        else:
            img = img.convert(mode)
        img.save(os.path.join(directory, "png", "img_%02d_%s.png" % (i, mode.replace(";", ""))),
                 "PNG", compress_level=(i % 9) + 1, optimize=(i == 7))
    picture(rng, 301, 203).save(os.path.join(directory, "other", "raw.ppm"), "PPM")
    picture(rng, 257, 129).save(os.path.join(directory, "other", "raw.bmp"), "BMP")
    picture(rng, 190, 170, "L").save(os.path.join(directory, "other", "gray.tif"), "TIFF")
    picture(rng, 160, 120).convert("P").save(os.path.join(directory, "other", "anim.gif"), "GIF")
    return 0


def read(directory):
    out = []
    names = []
    for dirpath, dirnames, files in os.walk(directory):
        dirnames.sort()
        names += [os.path.join(dirpath, n) for n in sorted(files)]
    for path in names:
        name = os.path.relpath(path, directory)
        with open(path, "rb") as f:
            raw = f.read()
        with Image.open(path) as img:
            header = (img.format, img.mode, img.size)  # Header only so far.
            img.load()
            pixels = img.tobytes()
            out.append("%s: %s %s %s pixels %s raw %d %s" % (
                name, header[0], header[1], header[2], h(pixels), len(raw), h(raw)))
        with Image.open(io.BytesIO(raw)) as mem:
            mem.load()
            out.append("%s: decoded from memory %s" % (
                name, "same" if mem.tobytes() == pixels else "DIFFERENT"))
        if name.endswith(".jpg"):
            with Image.open(path) as img:
                img.draft("RGB", (img.size[0] // 2, img.size[1] // 2))
                img.load()
                out.append("%s: draft %s %s" % (name, img.size, h(img.tobytes())))
        if name.endswith(".png"):
            with Image.open(path) as img:
                img.verify()
                out.append("%s: verify ok" % name)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        return write(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "read":
        return read(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
