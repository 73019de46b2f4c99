//! Reading COCO ground truth (`images`, `annotations`, `categories`) and COCO results (a list of
//! `{image_id, category_id, bbox, score}`), with errors that name the file and the entry.
//!
//! What is rejected: malformed JSON; a missing or mistyped field; duplicate image, category or annotation ids;
//! a GT annotation of an unknown image or category; a bbox that is not 4 finite numbers or has a negative width
//! or height; a missing, negative or non-finite GT `area`; a detection of an image that is not in the ground
//! truth (pycocotools asserts the same) or with a non-finite score. Detections of a category the ground truth
//! does not list are skipped and counted, as pycocotools skips them.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{DtBox, GtBox};
use crate::error::{Error, Result};

/// One `images` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CocoImage {
    /// Image id.
    pub id: i64,
    /// Width in pixels, when given.
    pub width: Option<f64>,
    /// Height in pixels, when given.
    pub height: Option<f64>,
    /// File name, when given.
    pub file_name: Option<String>,
}

/// One `categories` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CocoCategory {
    /// Category id.
    pub id: i64,
    /// Name (empty when absent).
    pub name: String,
}

/// A COCO ground-truth document.
#[derive(Debug, Clone, Default)]
pub struct CocoDataset {
    /// Images in file order.
    pub images: Vec<CocoImage>,
    /// Categories in file order.
    pub categories: Vec<CocoCategory>,
    /// `(image_id, box)` per annotation, in file order.
    pub annotations: Vec<(i64, GtBox)>,
}

/// A COCO results list.
#[derive(Debug, Clone, Default)]
pub struct Detections {
    /// `(image_id, box)` per detection, in file order (detections of unknown categories left out).
    pub dets: Vec<(i64, DtBox)>,
    /// Number of detections skipped because the ground truth does not list their category.
    pub skipped_unknown_category: usize,
}

#[derive(Deserialize)]
struct RawGt {
    images: Vec<RawImage>,
    annotations: Vec<RawAnn>,
    categories: Vec<RawCat>,
}

#[derive(Deserialize)]
struct RawImage {
    id: i64,
    width: Option<f64>,
    height: Option<f64>,
    file_name: Option<String>,
}

#[derive(Deserialize)]
struct RawCat {
    id: i64,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct RawAnn {
    id: i64,
    image_id: i64,
    category_id: i64,
    bbox: Vec<f64>,
    area: Option<f64>,
    #[serde(default)]
    iscrowd: Option<Value>,
}

#[derive(Deserialize)]
struct RawDet {
    image_id: i64,
    category_id: i64,
    bbox: Vec<f64>,
    score: f64,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Parses `bytes` as `T`; on a data error, finds the first entry of the listed arrays that does not parse and
/// names it.
/// Checks one array entry; `Some(reason)` when it is invalid.
type EntryCheck = fn(&Value) -> Option<String>;

fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str, arrays: &[(&str, EntryCheck)]) -> Result<T> {
    match serde_json::from_slice::<T>(bytes) {
        Ok(v) => Ok(v),
        Err(e) if e.is_syntax() || e.is_eof() || e.is_io() => Err(Error::Json { what: what.into(), source: e }),
        Err(e) => {
            let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
                return Err(Error::Json { what: what.into(), source: e });
            };
            for (key, check) in arrays {
                let list = if key.is_empty() { Some(&doc) } else { doc.get(key) };
                let entry_name =
                    |i: usize| if key.is_empty() { format!("detection #{i}") } else { format!("{key}[{i}]") };
                match list {
                    None if !doc.is_object() => {
                        return Err(Error::Entry {
                            what: what.into(),
                            entry: "top level".into(),
                            reason: "expected a JSON object".into(),
                        });
                    }
                    None => {
                        return Err(Error::Entry {
                            what: what.into(),
                            entry: "top level".into(),
                            reason: format!("missing key `{key}`"),
                        });
                    }
                    Some(Value::Array(items)) => {
                        for (i, item) in items.iter().enumerate() {
                            if let Some(reason) = check(item) {
                                return Err(Error::Entry { what: what.into(), entry: entry_name(i), reason });
                            }
                        }
                    }
                    Some(_) => {
                        let entry = if key.is_empty() { "top level".to_string() } else { format!("`{key}`") };
                        return Err(Error::Entry { what: what.into(), entry, reason: "expected a JSON array".into() });
                    }
                }
            }
            Err(Error::Json { what: what.into(), source: e })
        }
    }
}

fn check_as<T: DeserializeOwned>(v: &Value) -> Option<String> {
    T::deserialize(v).err().map(|e| e.to_string())
}

fn bbox4(b: &[f64]) -> std::result::Result<[f64; 4], String> {
    let arr: [f64; 4] = b.try_into().map_err(|_| format!("bbox has {} numbers, expected 4 [x, y, w, h]", b.len()))?;
    if arr.iter().any(|v| !v.is_finite()) {
        return Err(format!("bbox {arr:?} is not finite"));
    }
    if arr[2] < 0.0 || arr[3] < 0.0 {
        return Err(format!("bbox {arr:?} has a negative width or height"));
    }
    Ok(arr)
}

fn truthy(v: &Option<Value>) -> std::result::Result<bool, String> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::Number(n)) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
        Some(other) => Err(format!("iscrowd must be 0/1 or a boolean, got {other}")),
    }
}

impl CocoDataset {
    /// Reads a ground-truth file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_slice(&read(path)?, &path.display().to_string())
    }

    /// Parses a ground-truth document; `what` names it in errors.
    pub fn from_slice(bytes: &[u8], what: &str) -> Result<Self> {
        let raw: RawGt = parse(
            bytes,
            what,
            &[
                ("images", check_as::<RawImage>),
                ("categories", check_as::<RawCat>),
                ("annotations", check_as::<RawAnn>),
            ],
        )?;
        let err = |entry: String, reason: String| Error::Entry { what: what.into(), entry, reason };
        let mut image_ids = HashSet::with_capacity(raw.images.len());
        let mut images = Vec::with_capacity(raw.images.len());
        for (i, im) in raw.images.into_iter().enumerate() {
            if !image_ids.insert(im.id) {
                return Err(err(format!("images[{i}]"), format!("duplicate image id {}", im.id)));
            }
            for (name, v) in [("width", im.width), ("height", im.height)] {
                if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                    return Err(err(format!("images[{i}] (id {})", im.id), format!("{name} {v} is negative")));
                }
            }
            images.push(CocoImage { id: im.id, width: im.width, height: im.height, file_name: im.file_name });
        }
        let mut cat_ids = HashSet::new();
        for (i, c) in raw.categories.iter().enumerate() {
            if !cat_ids.insert(c.id) {
                return Err(err(format!("categories[{i}]"), format!("duplicate category id {}", c.id)));
            }
        }
        let categories = raw.categories.into_iter().map(|c| CocoCategory { id: c.id, name: c.name }).collect();
        let mut ann_ids = HashSet::with_capacity(raw.annotations.len());
        let mut annotations = Vec::with_capacity(raw.annotations.len());
        for (i, a) in raw.annotations.into_iter().enumerate() {
            let entry = || format!("annotations[{i}] (id {})", a.id);
            if !ann_ids.insert(a.id) {
                return Err(err(entry(), "duplicate annotation id".into()));
            }
            if !image_ids.contains(&a.image_id) {
                return Err(err(entry(), format!("unknown image id {}", a.image_id)));
            }
            if !cat_ids.contains(&a.category_id) {
                return Err(err(entry(), format!("unknown category id {}", a.category_id)));
            }
            let bbox = bbox4(&a.bbox).map_err(|r| err(entry(), r))?;
            let area = match a.area {
                None => return Err(err(entry(), "missing `area` (needed for the area ranges)".into())),
                Some(v) if !(v.is_finite() && v >= 0.0) => return Err(err(entry(), format!("area {v} is negative"))),
                Some(v) => v,
            };
            let iscrowd = truthy(&a.iscrowd).map_err(|r| err(entry(), r))?;
            annotations.push((a.image_id, GtBox { id: a.id, category_id: a.category_id, bbox, area, iscrowd }));
        }
        Ok(Self { images, categories, annotations })
    }
}

impl Detections {
    /// Reads a results file and checks it against `gt`.
    pub fn from_path(path: impl AsRef<Path>, gt: &CocoDataset) -> Result<Self> {
        let path = path.as_ref();
        Self::from_slice(&read(path)?, &path.display().to_string(), gt)
    }

    /// Parses a results list; `what` names it in errors.
    pub fn from_slice(bytes: &[u8], what: &str, gt: &CocoDataset) -> Result<Self> {
        let raw: Vec<RawDet> = parse(bytes, what, &[("", check_as::<RawDet>)])?;
        let images: HashSet<i64> = gt.images.iter().map(|i| i.id).collect();
        let cats: HashSet<i64> = gt.categories.iter().map(|c| c.id).collect();
        let mut out = Detections { dets: Vec::with_capacity(raw.len()), skipped_unknown_category: 0 };
        for (i, d) in raw.into_iter().enumerate() {
            let err = |reason: String| Error::Entry {
                what: what.into(),
                entry: format!("detection #{i} (image_id {})", d.image_id),
                reason,
            };
            if !images.contains(&d.image_id) {
                return Err(err("unknown image id (not in the ground truth)".into()));
            }
            let bbox = bbox4(&d.bbox).map_err(err)?;
            if !d.score.is_finite() {
                return Err(err(format!("score {} is not finite", d.score)));
            }
            if !cats.contains(&d.category_id) {
                out.skipped_unknown_category += 1;
                continue;
            }
            out.dets.push((d.image_id, DtBox { category_id: d.category_id, bbox, score: d.score }));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GT: &str = r#"{"images": [{"id": 1, "width": 10, "height": 10}, {"id": 2}],
        "categories": [{"id": 3, "name": "cat"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "area": 16, "iscrowd": 0}]}"#;

    fn gt_err(s: &str) -> String {
        CocoDataset::from_slice(s.as_bytes(), "gt.json").unwrap_err().to_string()
    }

    #[test]
    fn reads_a_small_document() {
        let gt = CocoDataset::from_slice(GT.as_bytes(), "gt.json").unwrap();
        assert_eq!(gt.images.len(), 2);
        assert_eq!(gt.annotations[0].1.bbox, [1.0, 1.0, 4.0, 4.0]);
        let d = r#"[{"image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "score": 0.5},
                    {"image_id": 2, "category_id": 99, "bbox": [1, 1, 4, 4], "score": 0.5}]"#;
        let dt = Detections::from_slice(d.as_bytes(), "dt.json", &gt).unwrap();
        assert_eq!((dt.dets.len(), dt.skipped_unknown_category), (1, 1));
    }

    #[test]
    fn errors_name_the_entry() {
        let e = gt_err(&GT.replace("\"bbox\": [1, 1, 4, 4]", "\"bbox\": [1, 1, -4, 4]"));
        assert!(e.contains("gt.json: annotations[0] (id 1)") && e.contains("negative"), "{e}");
        let e = gt_err(&GT.replace("\"image_id\": 1", "\"image_id\": 7"));
        assert!(e.contains("unknown image id 7"), "{e}");
        let e = gt_err(&GT.replace("\"area\": 16, ", ""));
        assert!(e.contains("missing `area`"), "{e}");
        let e = gt_err(&GT.replace("\"bbox\": [1, 1, 4, 4]", "\"bbox\": [1, 1, 4]"));
        assert!(e.contains("annotations[0]") && e.contains("expected 4"), "{e}");
        let e = gt_err(&GT.replace("\"image_id\": 1", "\"image_id\": \"one\""));
        assert!(e.contains("annotations[0]") && e.contains("invalid type"), "{e}");
        let e = gt_err(&GT.replace("{\"id\": 2}", "{\"id\": 1}"));
        assert!(e.contains("images[1]") && e.contains("duplicate"), "{e}");
        let e = gt_err(&GT.replace("\"width\": 10", "\"width\": -10"));
        assert!(e.contains("images[0] (id 1)") && e.contains("negative"), "{e}");
        let e = gt_err(&GT[..40]);
        assert!(e.contains("gt.json") && e.contains("line"), "{e}");
        let e = gt_err(r#"{"images": []}"#);
        assert!(e.contains("missing key `annotations`") || e.contains("missing key `categories`"), "{e}");
        let gt = CocoDataset::from_slice(GT.as_bytes(), "gt.json").unwrap();
        let dt = |s: &str| Detections::from_slice(s.as_bytes(), "dt.json", &gt).unwrap_err().to_string();
        let e = dt(r#"[{"image_id": 5, "category_id": 3, "bbox": [1, 1, 4, 4], "score": 0.5}]"#);
        assert!(e.contains("detection #0 (image_id 5)") && e.contains("unknown image id"), "{e}");
        let e = dt(r#"[{"image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "score": 0.5},
                       {"image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4]}]"#);
        assert!(e.contains("detection #1") && e.contains("score"), "{e}");
        let e = dt(r#"{"image_id": 1}"#);
        assert!(e.contains("array"), "{e}");
        let e = dt("[1, 2");
        assert!(e.contains("dt.json") && e.contains("line 1"), "{e}");
    }
}
