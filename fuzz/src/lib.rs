//! The bodies of Sluice's fuzz targets, one function per target in `fuzz_targets/`, kept in a library so that
//! `cargo test` (stable, no libFuzzer) replays the committed corpus through exactly the code the fuzzer runs.
//!
//! Every function takes arbitrary bytes and must return normally: a panic (an `unwrap` or index out of bounds in
//! the crate under test, or a failed invariant check here) is a finding. Errors are the expected answer to bad
//! input; they are formatted (their `Display` must not panic either) and dropped.

use std::fmt::Write as _;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use sluice_core::Reader as _;
use sluice_dataset::labels::to_pixel_labels;
use sluice_decode::resize::target_size;
use sluice_decode::{
    DecodeHint, Format, ImageDecoder, ImageRgb8, Orientation, TargetOptions, dct_denominator, decode_to_target,
    jpeg_orientation,
};
use sluice_storage::{PackedReader, StorageError, Verify, decode_labels};

/// Formats an error the way a report would, so broken `Display` impls are found too.
fn render(e: &dyn std::fmt::Display) {
    let mut s = String::new();
    let _ = write!(s, "{e}");
    std::hint::black_box(s);
}

/// Class counts the label target validates against: one class, COCO's 80, and a large one.
const CLASS_COUNTS: [usize; 3] = [1, 80, 1000];
/// Image sizes the parsed rows are turned into pixel boxes for.
const IMAGE_SIZES: [(u32, u32); 3] = [(1, 1), (640, 480), (10_000, 37)];

/// `parse_yolo_labels` → `to_pixel_labels` on arbitrary text (invalid UTF-8 replaced, as a superset of what the
/// indexer feeds it: it refuses non-UTF-8 label files before parsing).
///
/// Checks on success: every row has a class below `nc`, finite coordinates within Ultralytics' tolerance and a
/// 1-based line inside the file; rows are unique; every pixel box lies inside the image with a positive area, and
/// each row is either a box or a zero-area problem.
pub fn yolo_labels(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("fuzz/labels.txt");
    let lines = text.split('\n').count();
    for nc in CLASS_COUNTS {
        let parsed = match sluice_dataset::parse_yolo_labels(&text, path, nc) {
            Ok(p) => p,
            Err(e) => {
                render(&e);
                continue;
            }
        };
        let tol = sluice_dataset::labels::COORD_TOLERANCE;
        for r in &parsed.rows {
            assert!((r.class as usize) < nc, "class {} with nc {nc}", r.class);
            for v in [r.cx, r.cy, r.w, r.h] {
                assert!(v.is_finite() && (-tol..=1.0 + tol).contains(&v), "coordinate {v} in {r:?}");
            }
            assert!((1..=lines).contains(&r.line), "line {} of {lines}", r.line);
        }
        // Rows are compared by value, as `np.unique` does (so -0.0 equals 0.0): `+ 0.0` turns -0.0 into 0.0.
        let mut keys: Vec<[u32; 5]> = parsed
            .rows
            .iter()
            .map(|r| {
                [r.class, (r.cx + 0.0).to_bits(), (r.cy + 0.0).to_bits(), (r.w + 0.0).to_bits(), (r.h + 0.0).to_bits()]
            })
            .collect();
        keys.sort_unstable();
        assert!(keys.windows(2).all(|w| w[0] != w[1]), "duplicate rows survived: {:?}", parsed.rows);
        for (w, h) in IMAGE_SIZES {
            let (labels, problems) = to_pixel_labels(&parsed.rows, w, h, path);
            let (wf, hf) = (w as f32, h as f32);
            for l in &labels {
                let b = l.bbox;
                assert!(
                    0.0 <= b.x1 && b.x1 < b.x2 && b.x2 <= wf && 0.0 <= b.y1 && b.y1 < b.y2 && b.y2 <= hf,
                    "box {b:?} outside {w}x{h} or empty"
                );
            }
            let zero_area = problems.iter().filter(|p| p.kind == sluice_dataset::ProblemKind::ZeroArea).count();
            assert_eq!(labels.len() + zero_area, parsed.rows.len(), "a row got lost or counted twice");
            for p in &problems {
                render(p);
            }
        }
    }
}

/// Where the shard target writes its input: a per-process file, in RAM (`/dev/shm`) where there is one.
fn shard_path() -> PathBuf {
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
    dir.join(format!("sluice-fuzz-{}.sluice", std::process::id()))
}

/// Byte 0 of a `packed_reader` input: which checks the harness makes pass before the reader sees the bytes, so
/// the fuzzer also reaches the index-entry validation and reads behind the header and index checksums.
const FIX_MAGIC: u8 = 1;
/// Make names length end the shard exactly at the end of the file.
const FIX_LENGTH: u8 = 2;
/// Recompute the index + names checksum (from the header's offsets, where they lie inside the input).
const FIX_INDEX_CRC: u8 = 4;
/// Recompute the header checksum (last, as it covers the fields above).
const FIX_HEADER_CRC: u8 = 8;

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The shard bytes for an input: byte 0 says which fields to repair (see [`FIX_MAGIC`] and friends), the rest is
/// the file.
pub fn shard_bytes(data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else { return Vec::new() };
    let mut b = rest.to_vec();
    if b.len() < 64 {
        return b;
    }
    if mode & FIX_MAGIC != 0 {
        b[0..8].copy_from_slice(sluice_storage::shard::MAGIC);
        b[8..12].copy_from_slice(&sluice_storage::shard::FORMAT_VERSION.to_le_bytes());
    }
    let names_offset = u64_at(&b, 32);
    if mode & FIX_LENGTH != 0 && names_offset <= b.len() as u64 {
        let names_len = b.len() as u64 - names_offset;
        b[40..48].copy_from_slice(&names_len.to_le_bytes());
    }
    if mode & FIX_INDEX_CRC != 0 {
        let (index_offset, names_len) = (u64_at(&b, 24), u64_at(&b, 40));
        let end = names_offset.checked_add(names_len);
        if let Some(end) = end.filter(|&e| index_offset <= e && e <= b.len() as u64) {
            let crc = crc32(&b[index_offset as usize..end as usize]);
            b[48..52].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if mode & FIX_HEADER_CRC != 0 {
        let crc = crc32(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    b
}

/// CRC-32 (IEEE), bitwise: the harness must not share code with the reader it checks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// At most this many records are read per input (a valid index holds one 32-byte entry per record, so inputs
/// stay small anyway).
const MAX_RECORDS_READ: usize = 256;

/// `PackedReader::open` on arbitrary bytes written to a file (the reader only opens paths; its map is private).
///
/// Must answer with an error for anything that is not a valid shard, never panic or read outside the map. On
/// success: checked reads either return the record or `CorruptRecord` with the record id; unchecked reads always
/// return slices of the file; `verify_all` agrees with the checked reads; ids past the end are `OutOfRange`;
/// record label bytes go through `decode_labels` (an error or labels, never a panic).
pub fn packed_reader(data: &[u8]) {
    let bytes = shard_bytes(data);
    let path = shard_path();
    std::fs::write(&path, &bytes).expect("write the fuzz input to a temporary file");
    let result = PackedReader::open(&path);
    // The map keeps the file's bytes; the name is not needed any more (and no file is left behind on any path).
    let _ = std::fs::remove_file(&path);
    let reader = match result {
        Ok(r) => r,
        Err(e) => {
            assert!(matches!(e, StorageError::BadShard { .. }), "open must report a bad shard, got {e:?}");
            render(&e);
            return;
        }
    };
    assert_eq!(reader.file_bytes(), bytes.len());
    let n = reader.records();
    assert!(n * 32 + 64 <= bytes.len(), "{n} records in {} bytes", bytes.len());
    let mut corrupt = 0;
    for id in 0..n.min(MAX_RECORDS_READ) as u64 {
        let name = reader.name(id).expect("name of an existing record");
        match reader.record(id) {
            Ok(r) => {
                assert_eq!(r.name, name);
                let (image, labels) = (reader.image(id).expect("image"), reader.labels(id).expect("labels"));
                assert_eq!((image, labels), (r.image, r.labels));
                match decode_labels(id, r.labels) {
                    Ok(l) => assert_eq!(l.objects.len() * 20 + 12, r.labels.len()),
                    Err(e) => render(&e),
                }
            }
            Err(e) => {
                assert!(matches!(e, StorageError::CorruptRecord { id: i, .. } if i == id), "record {id}: {e:?}");
                render(&e);
                corrupt += 1;
            }
        }
    }
    if n <= MAX_RECORDS_READ {
        assert_eq!(reader.verify_all().len(), corrupt, "verify_all disagrees with the checked reads");
    }
    let past = reader.record(n as u64).expect_err("record past the end");
    assert!(matches!(past, StorageError::OutOfRange { .. }), "{past:?}");
    assert!(reader.record(u64::MAX).is_err());
    let unchecked = reader.with_verify(Verify::Never);
    let mut scratch = Vec::new();
    for id in 0..n.min(MAX_RECORDS_READ) as u64 {
        let r = unchecked.record(id).expect("an unchecked read of a validated entry");
        assert!(r.image.len() + r.labels.len() <= bytes.len());
        let read = unchecked.read(id, &mut scratch).expect("Reader::read of a validated entry");
        assert_eq!(read, r.image);
        assert!(scratch.is_empty(), "the packed reader serves slices of the map, no copies");
    }
}

/// The decoder's pixel limit under fuzzing: 4 Mpx (the crate's default is 2^27; a lower limit only moves the
/// point where `TooLarge` is answered, and keeps a hostile header from making every run allocate 400 MB).
pub const FUZZ_MAX_PIXELS: u64 = 1 << 22;

/// The target sizes `decode` resizes to, chosen by the input's length so committed seeds are plain image files.
const IMGSZ: [u32; 6] = [1, 7, 32, 64, 320, 640];

/// The `image` backend's `decode_to_target` (decode with EXIF orientation, then Ultralytics' resize) on arbitrary
/// bytes, with `imgsz`, `augment` and `dct_scaling` picked from the input's length.
///
/// Checks on success: the original size is the oriented decoded size and within the pixel limit; the output has
/// exactly `target_size`'s dimensions with a packed buffer; the backend decoded at scale 1, or at 1/4 or 1/8 (a
/// JPEG through jpeg-decoder's scaled IDCT) only with `dct_scaling` on and a source at least 4× `imgsz`. Bad bytes
/// must give an error.
pub fn decode(data: &[u8]) {
    let k = data.len();
    let opts =
        TargetOptions { imgsz: IMGSZ[k % 6], augment: (k / 6) % 2 == 1, dct_scaling: (k / 12).is_multiple_of(2) };
    let decoder = ImageDecoder::new().with_max_pixels(FUZZ_MAX_PIXELS);
    let (mut scratch, mut out) = (ImageRgb8::default(), ImageRgb8::default());
    let info = match decode_to_target(&decoder, data, opts, &mut scratch, &mut out) {
        Ok(info) => info,
        Err(e) => {
            render(&e);
            return;
        }
    };
    let (ow, oh) = (info.orig_width, info.orig_height);
    assert!(ow > 0 && oh > 0 && u64::from(ow) * u64::from(oh) <= FUZZ_MAX_PIXELS, "{ow}x{oh}");
    let denominator = if opts.dct_scaling { dct_denominator(ow.max(oh), Some(opts.imgsz)) } else { 1 };
    assert!(
        info.dct_scale == 1.0 || (denominator >= 4 && info.dct_scale == 1.0 / denominator as f32),
        "scale {} for {ow}x{oh} at imgsz {} (dct {})",
        info.dct_scale,
        opts.imgsz,
        opts.dct_scaling
    );
    let (r, w, h) = target_size(ow, oh, opts.imgsz);
    assert_eq!(info.ratio, r);
    assert_eq!((out.width(), out.height()), (w, h), "output size for {ow}x{oh} at imgsz {}", opts.imgsz);
    assert!(out.as_bytes().len() >= out.stride() * h as usize && out.stride() >= w as usize * 3);
    // The full-size decode of the same bytes: oriented, RGB8, `orig` in size. After a reduced decode it comes from
    // the other decoder (zune-jpeg), which refuses some files jpeg-decoder reads (e.g. an over-subscribed Huffman
    // table, `regressions/decode/bad_huffman_table_scaled`): then it must refuse with a corruption error. Both paths
    // read a JPEG's orientation the same way (`regressions/decode/damaged_exif_orientation`).
    let mut full = ImageRgb8::default();
    match decoder.decode_rgb(data, DecodeHint::default(), &mut full) {
        Ok(again) => {
            assert_eq!((again.orig_width, again.orig_height), (ow, oh));
            assert_eq!((full.width(), full.height()), (ow, oh));
        }
        Err(e) if info.dct_scale < 1.0 => assert!(e.to_string().contains("corrupt"), "{e}"),
        Err(e) => panic!("a second decode of the same bytes: {e}"),
    }
}

/// The dataset indexer's header reader (`read_header`'s body on an in-memory file: `imagesize` for JPEG SOF / PNG
/// IHDR / BMP / WebP sizes, kamadak-exif for the orientation, the JPEG end-of-image check), plus sluice-decode's
/// own JPEG marker walk (`jpeg_orientation`) and format sniffing on the same bytes.
///
/// Checks on success: both sides at least `MIN_SIDE`, orientation 1..=8, `missing_eoi` only for a JPEG and exactly
/// when its last two bytes are not `FF D9`; `jpeg_orientation` is `Normal` for anything that is not a JPEG.
pub fn read_header(data: &[u8]) {
    let sniffed = Format::sniff(data);
    let orientation = jpeg_orientation(data);
    if sniffed != Some(Format::Jpeg) {
        assert_eq!(orientation, Orientation::Normal, "an orientation outside a JPEG");
    }
    let h = match sluice_dataset::header::read_header_from(Cursor::new(data), Path::new("fuzz/image.jpg")) {
        Ok(h) => h,
        Err(e) => {
            render(&e);
            return;
        }
    };
    let min = sluice_dataset::header::MIN_SIDE;
    assert!(h.width >= min && h.height >= min, "{h:?}");
    assert!((1..=8).contains(&h.orientation), "{h:?}");
    let jpeg = h.format == sluice_dataset::ImageFormat::Jpeg;
    assert_eq!(h.missing_eoi, jpeg && !data.ends_with(&[0xFF, 0xD9]), "{h:?}");
}

/// `sluice_dataset::DataYaml::parse` (the pure half of `DataConfig::from_yaml_str`: YAML → paths as written and
/// class names, no filesystem access) on arbitrary text (invalid UTF-8 replaced: `DataConfig::load` reads the
/// file with `read_to_string`, which refuses it).
///
/// Checks on success: `train` and `val` name at least one source, there are at most `MAX_CLASSES` names, and
/// parsing the same text again gives the same answer.
pub fn data_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let yaml = Path::new("fuzz/data.yaml");
    match sluice_dataset::DataYaml::parse(&text, yaml) {
        Ok(d) => {
            assert!(!d.train.is_empty() && !d.val.is_empty(), "train or val empty: {d:?}");
            assert!(d.names.len() <= sluice_dataset::MAX_CLASSES, "{} names", d.names.len());
            let again = sluice_dataset::DataYaml::parse(&text, yaml);
            assert!(again.as_ref().is_ok_and(|a| *a == d), "not deterministic: {d:?} then {again:?}");
        }
        Err(e) => render(&e),
    }
}

/// Byte 0 of a `label_cache` input: bit 0 set → the harness writes the header line (magic, version, checksum,
/// length) for the rest of the input as the body, so the fuzzer reaches the JSON and the sample checks behind
/// the checksum; bits 1-2 pick the class count the cache is loaded for (1, 4, 80, 1000).
const CACHE_FIX_HEADER: u8 = 1;

/// The cache file bytes for an input (see [`CACHE_FIX_HEADER`]) and the class count to load it for.
pub fn cache_bytes(data: &[u8]) -> (Vec<u8>, usize) {
    let Some((&mode, rest)) = data.split_first() else { return (Vec::new(), 1) };
    let nc = CLASS_COUNTS_CACHE[usize::from(mode >> 1) & 3];
    if mode & CACHE_FIX_HEADER == 0 {
        return (rest.to_vec(), nc);
    }
    let sum = rest.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let version = sluice_dataset::cache::CACHE_VERSION;
    let mut out = format!("sluice-label-cache {version} {sum:016x} {}\n", rest.len()).into_bytes();
    out.extend_from_slice(rest);
    (out, nc)
}

const CLASS_COUNTS_CACHE: [usize; 4] = [1, 4, 80, 1000];

/// `sluice_dataset::cache::decode` (the body of `cache::load`) on arbitrary bytes, the header optionally repaired
/// by the harness (byte 0, [`CACHE_FIX_HEADER`]).
///
/// Checks on success: every cached sample is one a scan could have produced (classes below `nc`, one crowd flag
/// per object or none, finite boxes with a positive area inside the image), and the input was no shorter than
/// what it decoded to claims (no length field conjured entries).
pub fn label_cache(data: &[u8]) {
    let (bytes, nc) = cache_bytes(data);
    let path = Path::new("fuzz/labels/train.cache");
    match sluice_dataset::cache::decode(&bytes, path, nc) {
        Ok(entries) => {
            // Each entry is at least `{"image":"","image_stamp":null,...}` in the body: far more than 16 bytes.
            assert!(entries.len() * 16 <= bytes.len(), "{} entries from {} bytes", entries.len(), bytes.len());
            for e in &entries {
                let Some(s) = &e.sample else { continue };
                let l = &s.labels;
                assert!(s.crowd.is_empty() || s.crowd.len() == l.objects.len(), "crowd flags: {s:?}");
                let (w, h) = (l.width as f32, l.height as f32);
                for o in &l.objects {
                    assert!((o.class as usize) < nc, "class {} with nc {nc}", o.class);
                    let b = o.bbox;
                    assert!(
                        0.0 <= b.x1 && b.x1 < b.x2 && b.x2 <= w && 0.0 <= b.y1 && b.y1 < b.y2 && b.y2 <= h,
                        "box {b:?} outside {w}x{h} or empty"
                    );
                }
                for p in &e.problems {
                    render(p);
                }
            }
        }
        Err(e) => render(&e),
    }
}

/// The ground truth the `coco_json` target checks detections against: image ids 1 and 2, category ids 1 and 3.
const COCO_GT: &str = r#"{"images": [{"id": 1, "width": 10, "height": 10}, {"id": 2}],
    "categories": [{"id": 1, "name": "a"}, {"id": 3, "name": "b"}],
    "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "area": 16}]}"#;

/// COCO JSON on arbitrary bytes through all three readers: `sluice_dataset::coco::parse_coco` (the body of
/// `load_coco`: `instances_*.json` → a sample index), and `sluice_eval`'s `CocoDataset::from_slice` (the
/// ground truth of `sluice eval-coco`) and `Detections::from_slice` (its results list, against a fixed ground
/// truth: the same bytes cannot be both an object and a list).
///
/// Checks on success: the index has one name and category id per category, ids ascending, classes below the
/// class count, one crowd flag per object, finite boxes with a positive area; the eval side's boxes are 4 finite
/// numbers with non-negative width and height, areas finite and non-negative, scores finite, every detection of
/// an image and category of the ground truth.
pub fn coco_json(data: &[u8]) {
    let json = Path::new("fuzz/instances.json");
    match sluice_dataset::coco::parse_coco(data, json, Path::new("/imgs")) {
        Ok((index, problems)) => {
            let nc = index.names.len();
            let ids = index.category_ids.as_deref().unwrap_or_default();
            assert_eq!(ids.len(), nc, "category ids {ids:?} for {nc} names");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "category ids not ascending: {ids:?}");
            for s in &index.samples {
                assert_eq!(s.crowd.len(), s.labels.objects.len(), "crowd flags of {:?}", s.image);
                for o in &s.labels.objects {
                    assert!((o.class as usize) < nc, "class {} of {nc}", o.class);
                    let b = o.bbox;
                    assert!(
                        [b.x1, b.y1, b.x2, b.y2].iter().all(|v| v.is_finite()) && b.x1 < b.x2 && b.y1 < b.y2,
                        "box {b:?}"
                    );
                }
            }
            for p in &problems {
                render(p);
            }
        }
        Err(e) => render(&e),
    }
    let check_boxes = |dt: &sluice_eval::Detections, gt: &sluice_eval::CocoDataset| {
        for (img, d) in &dt.dets {
            assert!(gt.images.iter().any(|i| i.id == *img), "detection of unknown image {img}");
            assert!(gt.categories.iter().any(|c| c.id == d.category_id), "detection of unknown category");
            assert!(d.bbox.iter().all(|v| v.is_finite()) && d.bbox[2] >= 0.0 && d.bbox[3] >= 0.0, "{:?}", d.bbox);
            assert!(d.score.is_finite(), "score {}", d.score);
        }
    };
    let fixed = sluice_eval::CocoDataset::from_slice(COCO_GT.as_bytes(), "gt.json").expect("the fixed ground truth");
    match sluice_eval::Detections::from_slice(data, "fuzz/dt.json", &fixed) {
        Ok(dt) => check_boxes(&dt, &fixed),
        Err(e) => render(&e),
    }
    match sluice_eval::CocoDataset::from_slice(data, "fuzz/gt.json") {
        Ok(gt) => {
            for (img, a) in &gt.annotations {
                assert!(gt.images.iter().any(|i| i.id == *img), "annotation of unknown image {img}");
                assert!(a.bbox.iter().all(|v| v.is_finite()) && a.bbox[2] >= 0.0 && a.bbox[3] >= 0.0, "{:?}", a.bbox);
                assert!(a.area.is_finite() && a.area >= 0.0, "area {}", a.area);
            }
        }
        Err(e) => render(&e),
    }
}

/// `sluice_model::read_pt_bytes` (the body of `read_pt`: the zip, candle's pickle parser, the module-tree walk,
/// the tensor reads) on arbitrary bytes.
///
/// Checks on success: the weights come from `ema` or `model`, there is one name per class and at least one class,
/// every tensor holds exactly its shape's elements and has a state-dict name, and the scale builds a configuration.
pub fn pt_checkpoint(data: &[u8]) {
    match sluice_model::read_pt_bytes(data, Path::new("fuzz.pt")) {
        Err(e) => render(&e),
        Ok(ckpt) => {
            assert!(ckpt.entry == "ema" || ckpt.entry == "model", "entry {}", ckpt.entry);
            assert!(ckpt.nc >= 1 && ckpt.names.len() == ckpt.nc, "{} names for nc {}", ckpt.names.len(), ckpt.nc);
            for (name, t) in &ckpt.tensors {
                assert!(!name.is_empty() && !name.ends_with('.'), "tensor name `{name}`");
                assert_eq!(t.elem_count(), t.dims().iter().product::<usize>(), "{name}");
            }
            let cfg = ckpt.config();
            assert!(cfg.head_channels().iter().all(|&c| c > 0));
        }
    }
}
