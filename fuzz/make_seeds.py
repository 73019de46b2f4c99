#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/seed_* (standard library only).

A few files are copied from the crates' test fixtures (real COCO labels and JPEGs, the WebP); the rest are made
here: small PNGs (RGB, RGBA, gray, 16-bit gray, palette + tRNS, Adam7-interlaced, with an eXIf orientation), a BMP,
edge-case label files, and packed shards in the layout of crates/sluice-storage/src/shard/mod.rs. Deterministic;
rerun after changing it (`python3 fuzz/make_seeds.py` from the repository root or from fuzz/).
"""

import shutil
import struct
import zlib
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"
DECODE_DATA = ROOT / "crates/sluice-decode/tests/data"
LABEL_DATA = ROOT / "crates/sluice-dataset/tests/data/coco128-mini/labels/train2017"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed_{name}").write_bytes(data)


# ---------------------------------------------------------------- images


def png_chunk(kind, payload):
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def pixel(x, y, channels, depth):
    vals = [(x * 37 + y * 11 + c * 53) % 256 for c in range(channels)]
    if depth == 16:
        return b"".join(struct.pack(">H", v * 257) for v in vals)
    return bytes(vals)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png(w, h, color_type, depth=8, interlace=False, extra=b"", palette=None):
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    raw = bytearray()
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        xs, ys = range(x0, w, dx), range(y0, h, dy)
        if not xs or not ys:
            continue
        for y in ys:
            raw.append(0)  # filter: none
            for x in xs:
                if color_type == 3:
                    raw.append((x + y) % len(palette))
                else:
                    raw += pixel(x, y, channels, depth)
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0))
    if palette:
        out += png_chunk(b"PLTE", b"".join(bytes(p) for p in palette))
        out += png_chunk(b"tRNS", bytes([255, 128, 0]))
    out += extra
    out += png_chunk(b"IDAT", zlib.compress(bytes(raw), 9))
    out += png_chunk(b"IEND", b"")
    return out


def exif_tiff(orientation):
    # Big-endian TIFF header, IFD0 with one entry: Orientation (0x0112), SHORT, count 1.
    return b"MM\0\x2a\0\0\0\x08" + struct.pack(">HHHIHH", 1, 0x0112, 3, 1, orientation, 0) + b"\0\0\0\0"


def bmp(w, h):
    row = (w * 3 + 3) // 4 * 4
    pixels = bytearray()
    for y in reversed(range(h)):
        line = bytearray()
        for x in range(w):
            line += bytes(reversed(pixel(x, y, 3, 8)))
        pixels += line + b"\0" * (row - len(line))
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    head = b"BM" + struct.pack("<IHHI", 14 + len(info) + len(pixels), 0, 0, 14 + len(info))
    return head + info + bytes(pixels)


def images():
    pngs = {
        "rgb_12x10.png": png(12, 10, 2),
        "rgba_11x13.png": png(11, 13, 6),
        "gray_10x10.png": png(10, 10, 0),
        "gray16_10x12.png": png(10, 12, 0, depth=16),
        "graya_10x10.png": png(10, 10, 4),
        "palette_trns_12x12.png": png(12, 12, 3, palette=[(255, 0, 0), (0, 255, 0), (0, 0, 255), (9, 9, 9)]),
        "adam7_13x11.png": png(13, 11, 2, interlace=True),
        "exif6_16x10.png": png(16, 10, 2, extra=png_chunk(b"eXIf", exif_tiff(6))),
    }
    for name, data in pngs.items():
        write("decode", name, data)
    write("decode", "rgb_12x10.bmp", bmp(12, 10))
    for name in ["gray.jpg", "progressive.jpg", "exif_orient6.jpg", "cmyk.jpg", "rgb.webp"]:
        shutil.copyfile(DECODE_DATA / name, CORPUS / "decode" / f"seed_{name}")
    # Headers: sizes, orientations, a truncated JPEG (no EOI), a WebP's first bytes, a too-small PNG.
    write("read_header", "exif_orient6.jpg", (DECODE_DATA / "exif_orient6.jpg").read_bytes())
    write("read_header", "gray_truncated.jpg", (DECODE_DATA / "gray.jpg").read_bytes()[:1500])
    write("read_header", "progressive_head.jpg", (DECODE_DATA / "progressive.jpg").read_bytes()[:700])
    write("read_header", "rgb.webp_head", (DECODE_DATA / "rgb.webp").read_bytes()[:256])
    write("read_header", "exif6_16x10.png", pngs["exif6_16x10.png"])
    write("read_header", "small_9x30.png", png(9, 30, 0))
    write("read_header", "rgb_12x10.bmp", bmp(12, 10))


# ---------------------------------------------------------------- labels


def labels():
    for stem in ["000000000359", "000000000472", "000000000536"]:
        write("yolo_labels", f"coco_{stem}.txt", (LABEL_DATA / f"{stem}.txt").read_bytes())
    cases = {
        "polygon.txt": "1 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6\n0 0.3 0.3 0.4 0.4\n",
        "crlf_blank_edges.txt": "\r\n\n0 0.5 0.5 0.2 0.4\r\n\n3 0.1 0.2 0.05 0.1\r\n  \n",
        "duplicates.txt": "2 0.5 0.5 0.1 0.1\n1 0.3 0.3 0.1 0.1\n2 0.5 0.5 0.1 0.1\n0 0.9 0.9 0.1 0.1\n",
        "negative_zero_dup.txt": "0 -0 0.5 0.1 0.1\n0 -0 0.6 0.1 0.1\n0 0 0.5 0.1 0.1\n",
        "tolerance.txt": "0 0.5 0.5 1.005 0.5\n0 -0.005 0.5 0.0 0.5\n0 1.01 1e-3 5E-1 .25\n",
        "bad_number.txt": "0 0.5 x 0.2 0.2\n",
        "wrong_columns.txt": "0 0.5 0.5 0.2\n",
    }
    for name, text in cases.items():
        write("yolo_labels", name, text.encode())


# ---------------------------------------------------------------- shards


def encode_labels(width, height, objects):
    out = struct.pack("<III", width, height, len(objects))
    for cls, x1, y1, x2, y2 in objects:
        out += struct.pack("<Iffff", cls, x1, y1, x2, y2)
    return out


def shard(records, corrupt=None):
    """records: (name, image bytes, label bytes); corrupt: index of a record whose stored crc is wrong."""
    data, entries, names = bytearray(), [], bytearray()
    for i, (name, image, label) in enumerate(records):
        crc = zlib.crc32(image + label)
        if i == corrupt:
            crc ^= 1
        entries.append((64 + len(data), len(image), len(label), len(names), len(name.encode()), crc))
        data += image + label
        names += name.encode()
    index = b"".join(struct.pack("<QIIIIII", *e, 0) for e in entries)
    index_offset = 64 + len(data)
    names_offset = index_offset + len(index)
    head = b"SLUICESH" + struct.pack(
        "<IIQQQQI", 1, 0, len(records), index_offset, names_offset, len(names), zlib.crc32(index + bytes(names))
    )
    head += b"\0" * 8
    head += struct.pack("<I", zlib.crc32(head))
    assert len(head) == 64
    return head + bytes(data) + index + bytes(names)


def shards():
    recs = [
        ("images/000.jpg", (DECODE_DATA / "gray.jpg").read_bytes()[:120], encode_labels(160, 120, [(0, 1, 2, 30, 40)])),
        ("images/001.png", png(10, 10, 0), encode_labels(10, 10, [(3, 0, 0, 10, 10), (1, 2.5, 2.5, 5, 5)])),
        ("images/ünï.bmp", b"BM", b""),
        ("", b"", encode_labels(0, 0, [])),
    ]
    # Byte 0 of a packed_reader input says which fields the harness repairs (see fuzz/src/lib.rs): 0 = none,
    # 0x0f = magic, length, index and header checksums.
    write("packed_reader", "valid_4", b"\x00" + shard(recs))
    write("packed_reader", "valid_4_fixups", b"\x0f" + shard(recs))
    write("packed_reader", "empty", b"\x00" + shard([]))
    write("packed_reader", "corrupt_record_1", b"\x00" + shard(recs, corrupt=1))
    broken = bytearray(shard(recs))
    broken[64 + 8 * 0 + 3] ^= 0x55  # a byte of record 0; header and index checksums still match
    write("packed_reader", "bad_bytes_fixups", b"\x0c" + bytes(broken))


# ---------------------------------------------------------------- dataset YAML, label cache, COCO JSON


def data_yamls():
    w = lambda name, text: write("data_yaml", name, text.encode())
    w("coco128.yaml", "path: ../datasets/coco128\ntrain: images/train2017\nval: images/train2017\ntest:\n"
      "names:\n  0: person\n  1: bicycle\n  2: car\n")
    w("names_list.yaml", "train: [a/images, b.txt]\nvalidation: ../v\nnames: [cat, 1, true, null]\nnc: 4\n")
    w("nc_only.yaml", "train: t\nval: v\nnc: 3\n")
    w("bad_index.yaml", "train: t\nval: v\nnames: {0: a, 2: b, '1': c}\n")
    w("huge_nc.yaml", "train: t\nval: v\nnc: 1e15\n")
    w("anchors.yaml", "a: &x [t, t]\ntrain: *x\nval: *x\nnames: &n {0: a}\nextra: {<<: *n}\n")
    w("not_mapping.yaml", "- train\n- val\n")
    w("bad_syntax.yaml", "train: [a\nval: 'b\n")


def cache_file(body):
    h = 0xCBF29CE484222325
    for b in body:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"sluice-label-cache 1 {h:016x} {len(body)}\n".encode() + body


def label_caches():
    # Byte 0 (see fuzz/src/lib.rs): bit 0 = the harness writes the header; bits 1-2 = nc index (1, 4, 80, 1000).
    sample = (
        '{"image":"d/images/a.jpg","format":"jpeg","label_file":"d/labels/a.txt",'
        '"labels":{"width":640,"height":480,"objects":[{"class":3,"bbox":{"x1":1.5,"y1":2.0,"x2":100.0,"y2":50.25}}]},'
        '"crowd":[false],"image_id":null}'
    )
    entry = (
        '{"image":"d/images/a.jpg","image_stamp":{"len":1234,"mtime_ns":1700000000000000000},'
        '"label_stamp":{"len":20,"mtime_ns":1700000000000000001},"sample":' + sample + ',"problems":[]}'
    )
    skipped = (
        '{"image":"d/images/b.png","image_stamp":{"len":5,"mtime_ns":0},"label_stamp":null,"sample":null,'
        '"problems":[{"kind":"corrupt_image","file":"d/images/b.png","line":null,"message":"too small"}]}'
    )
    body = ('{"version":1,"nc":4,"entries":[' + entry + "," + skipped + "]}").encode()
    write("label_cache", "valid_nc4", b"\x02" + cache_file(body))
    write("label_cache", "valid_nc4_fixheader", b"\x03" + body)
    write("label_cache", "empty_nc1_fixheader", b"\x01" + b'{"version":1,"nc":1,"entries":[]}')
    write("label_cache", "bad_class_fixheader", b"\x01" + body.replace(b'"nc":4', b'"nc":1'))
    write("label_cache", "bad_checksum", b"\x02" + cache_file(body)[:-3] + b"]]}")
    write("label_cache", "huge_length", b"\x02sluice-label-cache 1 0000000000000000 18446744073709551615\n{}")
    write("label_cache", "old_version", b"\x02" + cache_file(body).replace(b"cache 1 ", b"cache 0 ", 1))


def coco_jsons():
    w = lambda name, text: write("coco_json", name, text.encode())
    w("instances.json", '{"images":[{"id":42,"file_name":"a.jpg","width":640,"height":480},'
      '{"id":7,"file_name":"b.png","width":100,"height":50}],'
      '"annotations":[{"id":1,"image_id":42,"category_id":18,"bbox":[10,20,30,40],"area":1200,"iscrowd":0},'
      '{"id":2,"image_id":42,"category_id":1,"bbox":[0,0,640,480],"area":307200,"iscrowd":1},'
      '{"id":3,"image_id":7,"category_id":18,"bbox":[5,5,0,10],"area":0},'
      '{"id":4,"image_id":99,"category_id":1,"bbox":[5,5,1,1],"area":1}],'
      '"categories":[{"id":18,"name":"dog"},{"id":1,"name":"person"}]}')
    w("f32_overflow.json", '{"images":[{"id":1,"file_name":"a","width":9,"height":9}],'
      '"annotations":[{"id":1,"image_id":1,"category_id":1,"bbox":[0,0,1e39,1],"area":1},'
      '{"id":2,"image_id":1,"category_id":1,"bbox":[3e38,0,3e38,1],"area":1e300,"iscrowd":true}],'
      '"categories":[{"id":1,"name":"a"},{"id":1,"name":"b"}]}')
    w("detections.json", '[{"image_id":1,"category_id":3,"bbox":[1,1,4,4],"score":0.5},'
      '{"image_id":2,"category_id":99,"bbox":[1.5,1,4,4e2],"score":1e-3}]')
    w("detection_bad.json", '[{"image_id":1,"category_id":1,"bbox":[1,1,-4,4],"score":0.5},{"image_id":1}]')
    w("deep.json", "[" * 200 + "]" * 200)
    w("truncated.json", '{"images":[{"id":1,"file_name":"a.jpg","wid')


def pt_checkpoints():
    """Small Ultralytics-like checkpoints in torch.save's layout (a zip: `archive/data.pkl`, protocol 2, tensors as
    persistent ids to `archive/data/<key>`), pickled by the standard library through stand-in classes registered
    under Ultralytics' and torch's module names: a two-layer DetectionModel (a Conv with its BatchNorm, a Detect
    head) that the reader accepts, and variants it refuses."""
    import io
    import pickle
    import struct
    import sys
    import types
    import zipfile
    from collections import OrderedDict

    def module(name):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        return sys.modules[name]

    def cls(modname, name, base=object):
        c = type(name, (base,), {"__module__": modname})
        setattr(module(modname), name, c)
        return c

    def rebuild(*args):
        raise RuntimeError("only pickled")

    rebuild.__module__, rebuild.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    module("torch._utils")._rebuild_tensor_v2 = rebuild
    storage_types = {"f": cls("torch", "FloatStorage"), "e": cls("torch", "HalfStorage")}
    storages = []

    class Storage:
        def __init__(self, kind, values):
            self.kind, self.values = kind, values

    class Tensor:
        def __init__(self, kind, shape, values):
            self.storage, self.shape = Storage(kind, values), shape

        def __reduce__(self):
            strides, acc = [], 1
            for d in reversed(self.shape):
                strides.insert(0, acc)
                acc *= d
            return (rebuild, (self.storage, 0, tuple(self.shape), tuple(strides), False, OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                key = str(len(storages))
                storages.append(obj)
                return ("storage", storage_types[obj.kind], key, "cpu", len(obj.values))
            return None

    def new(modname, name, **state):
        c = getattr(module(modname), name, None) or cls(modname, name)
        o = c.__new__(c)
        base = {"training": False, "_parameters": OrderedDict(), "_buffers": OrderedDict(), "_modules": OrderedDict()}
        base.update(state)
        o.__dict__.update(base)
        return o

    def t(shape, kind="f"):
        n = 1
        for d in shape:
            n *= d
        return Tensor(kind, shape, [0.25 * (i % 7) for i in range(n)])

    def conv(kind, fused=False):
        c2d = new("torch.nn.modules.conv", "Conv2d", _parameters=OrderedDict(weight=t((2, 3, 1, 1), kind)))
        mods = OrderedDict(conv=c2d)
        if not fused:
            bn = new("torch.nn.modules.batchnorm", "BatchNorm2d",
                     _parameters=OrderedDict(weight=t((2,), kind), bias=t((2,), kind)),
                     _buffers=OrderedDict(running_mean=t((2,), kind), running_var=t((2,), kind)))
            mods["bn"] = bn
        mods["act"] = new("torch.nn.modules.activation", "SiLU")
        return new("ultralytics.nn.modules.conv", "Conv", _modules=mods)

    def checkpoint(kind="f", head="Detect", extra=None, fused=False, yaml=None):
        storages.clear()
        layers = OrderedDict([("0", conv(kind, fused)), ("1", new("ultralytics.nn.modules.head", head, nc=2))])
        if extra:
            layers["2"] = new("ultralytics.nn.modules.block", extra)
        seq = new("torch.nn.modules.container", "Sequential", _modules=layers)
        yaml = yaml or {"nc": 2, "scales": {"n": [0.33, 0.25, 1024]}, "scale": "n"}
        model = new("ultralytics.nn.tasks", "DetectionModel", _modules=OrderedDict(model=seq), yaml=yaml,
                    names={0: "cat", 1: "dog"})
        buf = io.BytesIO()
        Pickler(buf, protocol=2).dump({"model": model, "ema": None, "epoch": -1, "version": "8.4.190"})
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", buf.getvalue())
            for key, st in enumerate(storages):
                fmt = "<%d%s" % (len(st.values), st.kind)
                z.writestr(f"archive/data/{key}", struct.pack(fmt, *st.values))
            z.writestr("archive/version", "3\n")
        return out.getvalue()

    w = lambda name, data: write("pt_checkpoint", name, data)
    ok = checkpoint()
    w("detect.pt", ok)
    w("detect_half.pt", checkpoint("e"))
    w("legacy_yaml.pt", checkpoint(yaml={"nc": 2, "depth_multiple": 0.33, "width_multiple": 0.125}))
    w("segment.pt", checkpoint(head="Segment"))
    w("yolo11.pt", checkpoint(extra="C3k2"))
    w("fused.pt", checkpoint(fused=True))
    w("truncated.pt", ok[: len(ok) // 2])
    w("not_zip.pt", b"PK\x03\x04 not really a zip")


if __name__ == "__main__":
    for t in ["yolo_labels", "packed_reader", "decode", "read_header", "data_yaml", "label_cache", "coco_json", "pt_checkpoint"]:
        d = CORPUS / t
        if d.is_dir():
            for f in d.glob("seed_*"):
                f.unlink()
    images()
    labels()
    shards()
    data_yamls()
    label_caches()
    coco_jsons()
    pt_checkpoints()
    total = sum(f.stat().st_size for f in CORPUS.rglob("seed_*"))
    print(f"seeds: {len(list(CORPUS.rglob('seed_*')))} files, {total} bytes")
