#!/usr/bin/env python3
"""Extracts the letterbox parity data of the Sluice loss fixture into small files (stdlib only).

Reads ../fixtures/loss/loss_fixture.json and loss_in_320.npy of the shared fixtures (Ultralytics 8.4.190
LetterBox(new_shape=(320, 320), auto=False, scale_fill=False, scaleup=True, center=True, stride=32) of two
coco128 images, decoded by OpenCV) and writes, next to this script:
  letterbox_320.json       the letterbox parameters and label rows of both images, and the letterboxed targets
  loss_in_320_<i>.png      each letterboxed input image as 8-bit RGB (round(x * 255) of the float input)
Usage: make_letterbox_fixture.py /path/to/shared/fixtures/loss /path/to/shared/datasets/coco128
"""
import json
import shutil
import struct
import sys
import zlib
from array import array
from pathlib import Path

here = Path(__file__).resolve().parent
loss = Path(sys.argv[1])
coco = Path(sys.argv[2])

fx = json.loads((loss / "loss_fixture.json").read_text())
out = {"source": "shared/fixtures/loss/loss_fixture.json (Ultralytics 8.4.190)", "images": fx["images"],
       "targets": fx["targets"]["rows"], "targets_note": fx["targets"]["note"]}
(here / "letterbox_320.json").write_text(json.dumps(out, indent=1) + "\n")
for im in fx["images"]:
    shutil.copyfile(coco / im["file"], here / Path(im["file"]).name)

raw = (loss / "loss_in_320.npy").read_bytes()
assert raw[:6] == b"\x93NUMPY"
hlen = struct.unpack("<H", raw[8:10])[0]
header = raw[10:10 + hlen].decode()
assert "'<f4'" in header and "(2, 3, 320, 320)" in header, header
data = array("f")
data.frombytes(raw[10 + hlen:])
n, c, h, w = 2, 3, 320, 320


def png(path, width, height, rows):
    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)
    body = b"".join(b"\x00" + r for r in rows)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(body, 9)) + chunk(b"IEND", b""))


for i in range(n):
    rows = []
    for y in range(h):
        row = bytearray(w * 3)
        for x in range(w):
            for ch in range(c):
                row[x * 3 + ch] = round(data[((i * c + ch) * h + y) * w + x] * 255)
        rows.append(bytes(row))
    png(here / f"loss_in_320_{i}.png", w, h, rows)
