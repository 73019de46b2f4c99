//! COCO `instances_*.json` → a [`SampleIndex`] (bbox `xywh` → `xyxy`, `iscrowd` kept, category ids mapped to
//! contiguous classes in ascending id order with the mapping kept), and the reverse: ground truth and detections
//! written as COCO JSON (the detections file is the results list `pycocotools`' `loadRes` reads).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::{BoxXyxy, Detection, ImageLabels, Label, SampleId};

use crate::error::{DatasetError, Result};
use crate::header::ImageFormat;
use crate::index::{Sample, SampleIndex};
use crate::problem::{Problem, ProblemKind};

#[derive(Debug, Deserialize)]
struct CocoIn {
    images: Vec<ImageIn>,
    #[serde(default)]
    annotations: Vec<AnnIn>,
    categories: Vec<CategoryIn>,
}

#[derive(Debug, Deserialize)]
struct ImageIn {
    id: u64,
    file_name: String,
    width: u32,
    height: u32,
}

#[derive(Debug, Deserialize)]
struct AnnIn {
    #[serde(default)]
    id: Option<u64>,
    image_id: u64,
    category_id: u64,
    bbox: [f64; 4],
    #[serde(default)]
    iscrowd: u8,
}

#[derive(Debug, Deserialize)]
struct CategoryIn {
    id: u64,
    name: String,
}

fn format_of(name: &str) -> ImageFormat {
    match name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).as_deref() {
        Some("png") => ImageFormat::Png,
        Some("bmp") => ImageFormat::Bmp,
        Some("webp") => ImageFormat::Webp,
        _ => ImageFormat::Jpeg,
    }
}

/// Reads COCO annotations; image paths are `image_dir/file_name`. Image sizes come from the JSON. Annotations
/// with an unknown image or category, or a box of zero width or height, are dropped and reported.
pub fn load_coco(json: &Path, image_dir: &Path) -> Result<(SampleIndex, Vec<Problem>)> {
    let text = std::fs::read(json).map_err(|e| DatasetError::io(json, e))?;
    parse_coco(&text, json, image_dir)
}

/// The body of [`load_coco`] on the file's bytes (no filesystem access): `json` names the file in errors and
/// problems, image paths are `image_dir/file_name`.
pub fn parse_coco(bytes: &[u8], json: &Path, image_dir: &Path) -> Result<(SampleIndex, Vec<Problem>)> {
    let coco: CocoIn = serde_json::from_slice(bytes)
        .map_err(|e| DatasetError::Json { path: json.to_path_buf(), reason: format!("invalid COCO JSON: {e}") })?;
    from_coco(coco, json, image_dir)
}

fn from_coco(coco: CocoIn, json: &Path, image_dir: &Path) -> Result<(SampleIndex, Vec<Problem>)> {
    let mut cats: Vec<&CategoryIn> = coco.categories.iter().collect();
    cats.sort_by_key(|c| c.id);
    if let Some(w) = cats.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(DatasetError::Json { path: json.to_path_buf(), reason: format!("category id {} twice", w[0].id) });
    }
    let class_of: HashMap<u64, u32> = cats.iter().enumerate().map(|(i, c)| (c.id, i as u32)).collect();
    let mut samples: Vec<Sample> = Vec::with_capacity(coco.images.len());
    let mut slot: HashMap<u64, usize> = HashMap::with_capacity(coco.images.len());
    for im in &coco.images {
        if slot.insert(im.id, samples.len()).is_some() {
            return Err(DatasetError::Json { path: json.to_path_buf(), reason: format!("image id {} twice", im.id) });
        }
        samples.push(Sample {
            image: image_dir.join(&im.file_name),
            format: format_of(&im.file_name),
            label_file: None,
            labels: ImageLabels { width: im.width, height: im.height, objects: Vec::new() },
            crowd: Vec::new(),
            image_id: Some(im.id),
        });
    }
    let mut problems = Vec::new();
    for (n, a) in coco.annotations.iter().enumerate() {
        let what = match a.id {
            Some(id) => format!("annotation id {id}"),
            None => format!("annotation #{n}"),
        };
        let (Some(&i), Some(&class)) = (slot.get(&a.image_id), class_of.get(&a.category_id)) else {
            let m = format!("{what}: unknown image_id {} or category_id {}: ignored", a.image_id, a.category_id);
            problems.push(Problem::file(ProblemKind::BadAnnotation, json, m));
            continue;
        };
        let [x, y, w, h] = a.bbox.map(|v| v as f32);
        // In f32, a huge `w` is infinite and `x + w` may round to `x` (or overflow): the box must come out
        // finite with a positive area, else it is dropped like a zero-area one.
        let bbox = BoxXyxy::from_xywh(x, y, w, h);
        if !(w > 0.0 && h > 0.0 && x.is_finite() && y.is_finite())
            || !(bbox.x2.is_finite() && bbox.y2.is_finite() && bbox.x2 > bbox.x1 && bbox.y2 > bbox.y1)
        {
            let m = format!("{what}: bbox [{x}, {y}, {w}, {h}] has no area: dropped");
            problems.push(Problem::file(ProblemKind::ZeroArea, json, m));
            continue;
        }
        let s = &mut samples[i];
        s.labels.objects.push(Label { class, bbox });
        s.crowd.push(a.iscrowd != 0);
    }
    let index = SampleIndex {
        names: cats.iter().map(|c| c.name.clone()).collect(),
        samples,
        category_ids: Some(cats.iter().map(|c| c.id).collect()),
    };
    Ok((index, problems))
}

/// The COCO image id of a sample: its own id, else the file stem when it is a number (Ultralytics' rule), else
/// its position in the index.
pub fn image_id(index: &SampleIndex, id: SampleId) -> u64 {
    let Some(s) = index.get(id) else { return id };
    s.image_id
        .or_else(|| s.image.file_stem().and_then(|x| x.to_str()).and_then(|x| x.parse::<u64>().ok()))
        .unwrap_or(id)
}

/// The COCO category id of a class: the kept mapping, else `class + 1` (Ultralytics' default for non-COCO).
pub fn category_id(index: &SampleIndex, class: u32) -> u64 {
    index.category_ids.as_ref().and_then(|m| m.get(class as usize).copied()).unwrap_or(u64::from(class) + 1)
}

#[derive(Debug, Serialize)]
struct ImageOut {
    id: u64,
    file_name: String,
    width: u32,
    height: u32,
}

#[derive(Debug, Serialize)]
struct AnnOut {
    id: u64,
    image_id: u64,
    category_id: u64,
    bbox: [f64; 4],
    area: f64,
    iscrowd: u8,
}

#[derive(Debug, Serialize)]
struct CategoryOut {
    id: u64,
    name: String,
}

#[derive(Debug, Serialize)]
struct CocoOut {
    images: Vec<ImageOut>,
    annotations: Vec<AnnOut>,
    categories: Vec<CategoryOut>,
}

/// One detection in COCO's results format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CocoDetection {
    /// COCO image id.
    pub image_id: u64,
    /// COCO category id.
    pub category_id: u64,
    /// `[x, y, w, h]` in pixels.
    pub bbox: [f64; 4],
    /// Confidence.
    pub score: f64,
}

fn xywh(b: &BoxXyxy) -> [f64; 4] {
    [f64::from(b.x1), f64::from(b.y1), f64::from(b.width()), f64::from(b.height())]
}

/// The ground truth of `index` as a COCO annotations JSON value (annotation ids from 1, `file_name` relative to
/// `image_dir` when under it).
pub fn export_ground_truth(index: &SampleIndex, image_dir: &Path) -> serde_json::Value {
    let mut images = Vec::with_capacity(index.len());
    let mut annotations = Vec::new();
    for (i, s) in index.samples.iter().enumerate() {
        let iid = image_id(index, i as SampleId);
        let name: PathBuf = s.image.strip_prefix(image_dir).map_or_else(|_| s.image.clone(), Path::to_path_buf);
        images.push(ImageOut {
            id: iid,
            file_name: name.to_string_lossy().into_owned(),
            width: s.labels.width,
            height: s.labels.height,
        });
        for (k, o) in s.labels.objects.iter().enumerate() {
            annotations.push(AnnOut {
                id: annotations.len() as u64 + 1,
                image_id: iid,
                category_id: category_id(index, o.class),
                bbox: xywh(&o.bbox),
                area: f64::from(o.bbox.area()),
                iscrowd: u8::from(s.crowd.get(k).copied().unwrap_or(false)),
            });
        }
    }
    let categories =
        index.names.iter().enumerate().map(|(c, n)| CategoryOut { id: category_id(index, c as u32), name: n.clone() });
    let out = CocoOut { images, annotations, categories: categories.collect() };
    serde_json::to_value(out).unwrap_or(serde_json::Value::Null)
}

/// Detections per sample (`(sample id, detections)`) as COCO results.
pub fn export_detections<'a>(
    index: &SampleIndex,
    dets: impl IntoIterator<Item = (SampleId, &'a [Detection])>,
) -> Vec<CocoDetection> {
    let mut out = Vec::new();
    for (id, ds) in dets {
        let iid = image_id(index, id);
        for d in ds {
            out.push(CocoDetection {
                image_id: iid,
                category_id: category_id(index, d.class),
                bbox: xywh(&d.bbox),
                score: f64::from(d.score),
            });
        }
    }
    out
}

/// Writes a JSON value to `path` atomically (temporary file + rename).
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| DatasetError::Json { path: path.to_path_buf(), reason: e.to_string() })?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        DatasetError::io(path, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{
      "images": [{"id": 42, "file_name": "a.jpg", "width": 640, "height": 480},
                 {"id": 7, "file_name": "b.png", "width": 100, "height": 50}],
      "annotations": [
        {"id": 1, "image_id": 42, "category_id": 18, "bbox": [10, 20, 30, 40], "iscrowd": 0},
        {"id": 2, "image_id": 42, "category_id": 1, "bbox": [0, 0, 640, 480], "iscrowd": 1},
        {"id": 3, "image_id": 7, "category_id": 18, "bbox": [5, 5, 0, 10]},
        {"id": 4, "image_id": 99, "category_id": 1, "bbox": [5, 5, 1, 1]}
      ],
      "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}]
    }"#;

    fn load() -> (SampleIndex, Vec<Problem>) {
        let coco: CocoIn = serde_json::from_str(JSON).unwrap();
        from_coco(coco, Path::new("instances.json"), Path::new("/imgs")).unwrap()
    }

    #[test]
    fn import_maps_categories_and_boxes() {
        let (idx, probs) = load();
        assert_eq!(idx.names, vec!["person", "dog"]);
        assert_eq!(idx.category_ids, Some(vec![1, 18]));
        let a = &idx.samples[0];
        assert_eq!(a.image, PathBuf::from("/imgs/a.jpg"));
        assert_eq!(a.image_id, Some(42));
        assert_eq!(a.labels.objects[0], Label { class: 1, bbox: BoxXyxy::new(10.0, 20.0, 40.0, 60.0) });
        assert_eq!(a.labels.objects[1].class, 0);
        assert_eq!(a.crowd, vec![false, true]);
        assert!(idx.samples[1].labels.objects.is_empty());
        let kinds: Vec<ProblemKind> = probs.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, vec![ProblemKind::ZeroArea, ProblemKind::BadAnnotation]);
        assert!(probs[1].to_string().starts_with("instances.json: annotation id 4"));
    }

    /// `w = 1e39` is infinite in f32, and `x + w` rounds to `x` for a tiny `w` next to a large `x`: both used to
    /// make a box with an infinite or zero extent; both are now dropped as zero-area.
    #[test]
    fn boxes_that_are_not_finite_in_f32_are_dropped() {
        let json = br#"{"images": [{"id": 1, "file_name": "a.jpg", "width": 9, "height": 9}],
          "annotations": [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1e39, 1]},
                          {"image_id": 1, "category_id": 1, "bbox": [1e9, 0, 1, 1]},
                          {"image_id": 1, "category_id": 1, "bbox": [3e38, 0, 3e38, 1]},
                          {"image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]}],
          "categories": [{"id": 1, "name": "a"}]}"#;
        let (idx, probs) = parse_coco(json, Path::new("i.json"), Path::new("/imgs")).unwrap();
        assert_eq!(idx.samples[0].labels.objects, vec![Label { class: 0, bbox: BoxXyxy::new(1.0, 2.0, 4.0, 6.0) }]);
        assert_eq!(idx.samples[0].crowd, vec![false]);
        assert!(probs.iter().all(|p| p.kind == ProblemKind::ZeroArea) && probs.len() == 3, "{probs:?}");
        assert!(parse_coco(b"[]", Path::new("i.json"), Path::new("/imgs")).is_err());
    }

    #[test]
    fn export_round_trips() {
        let (idx, _) = load();
        let gt = export_ground_truth(&idx, Path::new("/imgs"));
        let back: CocoIn = serde_json::from_value(gt.clone()).unwrap();
        let (idx2, probs) = from_coco(back, Path::new("x.json"), Path::new("/imgs")).unwrap();
        assert!(probs.is_empty());
        assert_eq!(idx2, idx);
        assert_eq!(gt["annotations"][1]["iscrowd"], 1);
        assert_eq!(gt["annotations"][0]["area"], 1200.0);
        let d = [Detection { bbox: BoxXyxy::new(1.0, 2.0, 4.0, 8.0), score: 0.5, class: 1 }];
        let res = export_detections(&idx, [(0, &d[..])]);
        assert_eq!(res, vec![CocoDetection { image_id: 42, category_id: 18, bbox: [1.0, 2.0, 3.0, 6.0], score: 0.5 }]);
    }

    #[test]
    fn yolo_ids_follow_ultralytics() {
        let idx = SampleIndex {
            names: vec!["a".into()],
            samples: vec![Sample {
                image: "/d/000000000009.jpg".into(),
                format: ImageFormat::Jpeg,
                label_file: None,
                labels: ImageLabels::default(),
                crowd: vec![],
                image_id: None,
            }],
            category_ids: None,
        };
        assert_eq!(image_id(&idx, 0), 9);
        assert_eq!(category_id(&idx, 0), 1);
    }
}
