//! Ultralytics dataset YAML (`data.yaml`) read as `check_det_dataset` does, and the image list of a split as
//! `get_img_files` builds it.
//!
//! * `path`: the dataset root. Absent → the YAML's folder. Absolute → as is. Relative → the YAML's folder joined
//!   with it if that exists, else relative to the working directory (Ultralytics tries the working directory,
//!   then its `DATASETS_DIR` setting, which Sluice does not have).
//! * `train`, `val` (or `validation`), `test`: each a folder (searched recursively), a `.txt` list of image paths
//!   (lines starting with `./` are relative to the list's folder, other relative lines to the working
//!   directory), or a list of those; joined onto the root; a missing `../x` falls back to `root/x`.
//! * `names`: a list or an index → name map (keys `0..n-1`); or `nc` alone (names `class_0`…); both must agree.
//! * Labels: the last `/images/` of the image path becomes `/labels/`, the extension becomes `.txt`.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use serde_yaml_ng::Value;

use crate::error::{DatasetError, Result};

/// Image extensions Ultralytics lists (`IMG_FORMATS`), matched case-insensitively. Files with these extensions
/// are listed; those whose bytes are not a format Sluice decodes are then skipped as unsupported.
pub const IMG_FORMATS: &[&str] =
    &["avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp"];

/// A dataset split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `train`.
    Train,
    /// `val`.
    Val,
    /// `test`.
    Test,
}

impl Split {
    /// The YAML key.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Val => "val",
            Self::Test => "test",
        }
    }
}

impl std::str::FromStr for Split {
    type Err = DatasetError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Self::Train),
            "val" | "validation" => Ok(Self::Val),
            "test" => Ok(Self::Test),
            other => Err(DatasetError::Invalid { what: "split", reason: format!("'{other}' (train, val or test)") }),
        }
    }
}

/// A resolved dataset description.
#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    /// The YAML file it was read from.
    pub yaml: PathBuf,
    /// The dataset root (`path`).
    pub root: PathBuf,
    /// Sources (folders or `.txt` lists) of the train split.
    pub train: Vec<PathBuf>,
    /// Sources of the val split.
    pub val: Vec<PathBuf>,
    /// Sources of the test split (often empty).
    pub test: Vec<PathBuf>,
    /// Class names, index = class id.
    pub names: Vec<String>,
}

/// The most classes a dataset YAML may declare (`nc`, or the length of `names`): class ids are `u32` and each
/// class gets a name string, so a hostile `nc: 1e15` must be an error, not an allocation.
pub const MAX_CLASSES: usize = 1 << 20;

/// One split's entry as written in the YAML, before it is joined onto the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitSpec {
    /// A single path (`train: images/train`); a missing `../x` falls back to `root/x` when resolved.
    One(String),
    /// A list of paths (empty when the key is absent or an empty string).
    List(Vec<String>),
}

impl SplitSpec {
    /// Whether the split names no source.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::List(v) if v.is_empty())
    }
}

/// A dataset YAML as written: parsed and checked, no path resolved. Pure (no filesystem access), so it is what
/// the fuzz target feeds; [`DataConfig::from_yaml_str`] resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataYaml {
    /// `path`, when given.
    pub path: Option<String>,
    /// `train`.
    pub train: SplitSpec,
    /// `val` (or `validation`).
    pub val: SplitSpec,
    /// `test`.
    pub test: SplitSpec,
    /// Class names, index = class id.
    pub names: Vec<String>,
}

impl DataYaml {
    /// Parses a dataset YAML's text; `yaml` only names errors. Errors, in order: invalid YAML, not a mapping,
    /// `names` / `nc`, `path` not a scalar, a split not a path or a list of paths, `train` or `val` missing.
    pub fn parse(text: &str, yaml: &Path) -> Result<Self> {
        let cfg = |reason: String| DatasetError::Config { path: yaml.to_path_buf(), reason };
        let doc: Value =
            serde_yaml_ng::from_str(text).map_err(|source| DatasetError::Yaml { path: yaml.to_path_buf(), source })?;
        let Value::Mapping(map) = doc else {
            return Err(cfg("a dataset YAML must be a mapping with 'train', 'val' and 'names' or 'nc'".into()));
        };
        let get = |k: &str| map.get(k).filter(|v| !v.is_null());
        let names = DataConfig::names(get("names"), get("nc")).map_err(cfg)?;
        let path = match get("path") {
            None => None,
            Some(v) => Some(py_str(v).ok_or_else(|| cfg(format!("'path: {v:?}' must be a string")))?),
        };
        let split = |key: &str| -> Result<SplitSpec> {
            let v = match get(key) {
                Some(v) => v,
                None if key == "val" => match get("validation") {
                    Some(v) => v,
                    None => return Ok(SplitSpec::List(Vec::new())),
                },
                None => return Ok(SplitSpec::List(Vec::new())),
            };
            match v {
                Value::String(s) if s.is_empty() => Ok(SplitSpec::List(Vec::new())),
                Value::String(s) => Ok(SplitSpec::One(s.clone())),
                Value::Sequence(items) => items
                    .iter()
                    .map(|i| match i {
                        Value::String(s) => Ok(s.clone()),
                        other => Err(cfg(format!("'{key}' entries must be strings, got {other:?}"))),
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(SplitSpec::List),
                other => Err(cfg(format!("'{key}' must be a path or a list of paths, got {other:?}"))),
            }
        };
        let (train, val, test) = (split("train")?, split("val")?, split("test")?);
        for (k, v) in [("train", &train), ("val", &val)] {
            if v.is_empty() {
                return Err(cfg(format!("'{k}:' key missing. 'train' and 'val' are required in all data YAMLs.")));
            }
        }
        Ok(Self { path, train, val, test, names })
    }
}

/// Lexically normalises an absolute path (`.` and `..`), then resolves symlinks where the path exists, like
/// Python's `Path.resolve()`.
fn resolve(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    };
    if let Ok(c) = std::fs::canonicalize(&abs) {
        return c;
    }
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Python's `str(v)` for a YAML scalar (names may be numbers or booleans).
fn py_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
        Value::Null => Some("None".to_string()),
        _ => None,
    }
}

impl DataConfig {
    /// Reads and resolves the dataset YAML at `yaml`.
    pub fn load(yaml: impl AsRef<Path>) -> Result<Self> {
        let yaml = yaml.as_ref();
        let text = std::fs::read_to_string(yaml).map_err(|e| DatasetError::io(yaml, e))?;
        Self::from_yaml_str(&text, yaml)
    }

    /// Resolves a dataset YAML's text; `yaml` is where it lives (the root of relative paths) and names errors.
    pub fn from_yaml_str(text: &str, yaml: &Path) -> Result<Self> {
        let doc = DataYaml::parse(text, yaml)?;
        let yaml_dir = resolve(yaml.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")));
        let root = match &doc.path {
            None => yaml_dir.clone(),
            Some(p) if is_url(p) => yaml_dir.clone(),
            Some(p) => {
                let p = PathBuf::from(p);
                if p.is_absolute() {
                    resolve(&p)
                } else if yaml_dir.join(&p).exists() {
                    resolve(&yaml_dir.join(&p))
                } else {
                    resolve(&p)
                }
            }
        };
        // A URL (`s3://bucket/coco/train.sluice`) is kept as written; a relative split under a URL `path:` joins
        // it with a slash.
        let url_root = doc.path.as_deref().filter(|p| is_url(p)).map(|p| p.trim_end_matches('/').to_string());
        let place = |s: &str| -> Option<PathBuf> {
            if is_url(s) {
                Some(PathBuf::from(s))
            } else {
                url_root.as_ref().map(|r| PathBuf::from(format!("{r}/{}", s.trim_start_matches("./"))))
            }
        };
        let split = |spec: &SplitSpec| -> Vec<PathBuf> {
            match spec {
                SplitSpec::One(s) if place(s).is_some() => place(s).into_iter().collect(),
                SplitSpec::List(items) if items.iter().any(|s| place(s).is_some()) => {
                    items.iter().map(|s| place(s).unwrap_or_else(|| resolve(&root.join(s)))).collect()
                }
                SplitSpec::One(s) => {
                    let mut x = resolve(&root.join(s));
                    if !x.exists()
                        && let Some(rest) = s.strip_prefix("../")
                    {
                        x = resolve(&root.join(rest));
                    }
                    vec![x]
                }
                SplitSpec::List(items) => items.iter().map(|s| resolve(&root.join(s))).collect(),
            }
        };
        let (train, val, test) = (split(&doc.train), split(&doc.val), split(&doc.test));
        Ok(Self { yaml: yaml.to_path_buf(), root, train, val, test, names: doc.names })
    }

    fn names(names: Option<&Value>, nc: Option<&Value>) -> std::result::Result<Vec<String>, String> {
        let nc = match nc {
            None => None,
            Some(v) => match v.as_f64() {
                // Names are made for `nc` alone, so a huge `nc` would be a huge allocation: bounded.
                Some(f) if f > MAX_CLASSES as f64 => {
                    return Err(format!("'nc: {v:?}' is more than {MAX_CLASSES} classes"));
                }
                Some(f) if f >= 0.0 && f.fract() == 0.0 => Some(f as usize),
                _ => return Err(format!("'nc: {v:?}' must be an integer")),
            },
        };
        let names = match names {
            None => match nc {
                Some(n) => (0..n).map(|i| format!("class_{i}")).collect(),
                None => return Err("key missing: either 'names' or 'nc' are required in all data YAMLs.".into()),
            },
            Some(Value::Sequence(items)) => items
                .iter()
                .map(|v| py_str(v).ok_or_else(|| format!("class name {v:?} is not a scalar")))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            Some(Value::Mapping(m)) => {
                let n = m.len();
                let mut out = vec![None; n];
                for (k, v) in m {
                    let idx = match k {
                        Value::Number(x) => x.as_i64(),
                        Value::String(s) => s.trim().parse::<i64>().ok(),
                        _ => None,
                    }
                    .ok_or_else(|| format!("class index {k:?} is not an integer"))?;
                    let name = py_str(v).ok_or_else(|| format!("class name {v:?} is not a scalar"))?;
                    match usize::try_from(idx).ok().filter(|&i| i < n) {
                        Some(i) => out[i] = Some(name),
                        None => {
                            return Err(format!(
                                "{n}-class dataset requires class indices 0-{}, but you have invalid class index {idx} defined in your dataset YAML.",
                                n as i64 - 1
                            ));
                        }
                    }
                }
                out.into_iter()
                    .enumerate()
                    .map(|(i, n)| n.ok_or_else(|| format!("class index {i} is defined twice or missing")))
                    .collect::<std::result::Result<Vec<_>, _>>()?
            }
            Some(other) => return Err(format!("'names' must be a list or a mapping, got {other:?}")),
        };
        if names.len() > MAX_CLASSES {
            return Err(format!("{} class names, more than {MAX_CLASSES}", names.len()));
        }
        if let Some(n) = nc
            && n != names.len()
        {
            return Err(format!("'names' length {} and 'nc: {n}' must match.", names.len()));
        }
        Ok(names)
    }

    /// Number of classes.
    pub fn nc(&self) -> usize {
        self.names.len()
    }

    /// The sources of `split` (empty for an absent `test`).
    pub fn sources(&self, split: Split) -> &[PathBuf] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
            Split::Test => &self.test,
        }
    }

    /// The sorted image files of `split`, as Ultralytics' `get_img_files` lists them.
    pub fn image_files(&self, split: Split) -> Result<Vec<PathBuf>> {
        if self.sources(split).is_empty() {
            let reason = format!("no '{}' split in this dataset YAML", split.as_str());
            return Err(DatasetError::Config { path: self.yaml.clone(), reason });
        }
        list_images(self.sources(split), &self.yaml)
    }
}

/// Whether a dataset YAML's path is a URL (`scheme://...`: `s3://`, `gs://`, `az://`, `https://`) rather than a
/// local path.
pub fn is_url(s: &str) -> bool {
    s.split_once("://").is_some_and(|(scheme, _)| {
        scheme.len() > 1 && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

fn has_img_ext(p: &Path) -> bool {
    // Ultralytics: `x.split(".")[-1].lower() in IMG_FORMATS` on the whole path string.
    let s = p.as_os_str().to_string_lossy();
    s.rsplit_once('.').is_some_and(|(_, ext)| IMG_FORMATS.contains(&ext.to_ascii_lowercase().as_str()))
}

/// Recursively lists files whose name holds a dot, skipping hidden entries (Python's `glob("**/*.*")`).
fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    if depth > 64 {
        return Ok(());
    }
    let rd = std::fs::read_dir(dir).map_err(|e| DatasetError::io(dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| DatasetError::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, like glob does.
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_dir() {
            walk(&path, depth + 1, out)?;
        } else if name.contains('.') {
            out.push(path);
        }
    }
    Ok(())
}

/// Lists the images of `sources` (folders or `.txt` lists), sorted like Python sorts path strings. `yaml`
/// names the dataset in errors.
pub fn list_images(sources: &[PathBuf], yaml: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in sources {
        if p.is_dir() {
            walk(p, 0, &mut files)?;
        } else if p.is_file() {
            let text = std::fs::read_to_string(p).map_err(|e| DatasetError::io(p, e))?;
            let parent = p.parent().unwrap_or(Path::new("/"));
            let cwd = std::env::current_dir().map_err(|e| DatasetError::io(".", e))?;
            for line in text.trim().lines() {
                let line = line.trim_end_matches('\r');
                if line.is_empty() {
                    continue;
                }
                let path = match line.strip_prefix("./") {
                    Some(rest) => parent.join(rest),
                    None => cwd.join(line),
                };
                files.push(path);
            }
        } else if is_url(&p.to_string_lossy()) {
            return Err(DatasetError::Config {
                path: yaml.to_path_buf(),
                reason: format!(
                    "{} is in object storage: its images are read from a shard written by `sluice pack`, by the \
                     commands that train, validate or pack (feature `object-store`), not listed as files",
                    p.display()
                ),
            });
        } else {
            return Err(DatasetError::Config {
                path: yaml.to_path_buf(),
                reason: format!("{} does not exist", p.display()),
            });
        }
    }
    files.retain(|f| has_img_ext(f));
    files.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    if files.is_empty() {
        let list: Vec<String> = sources.iter().map(|s| s.display().to_string()).collect();
        return Err(DatasetError::Config {
            path: yaml.to_path_buf(),
            reason: format!(
                "No images found in {}. Supported formats are: {}",
                list.join(", "),
                IMG_FORMATS.join(", ")
            ),
        });
    }
    Ok(files)
}

/// The label file of an image: the last `/images/` becomes `/labels/`, the extension `.txt`.
pub fn img2label_path(image: &Path) -> PathBuf {
    let s = image.as_os_str().to_string_lossy();
    let sep = std::path::MAIN_SEPARATOR;
    let (sa, sb) = (format!("{sep}images{sep}"), format!("{sep}labels{sep}"));
    let swapped = match s.rfind(&sa) {
        Some(i) => format!("{}{sb}{}", &s[..i], &s[i + sa.len()..]),
        None => s.to_string(),
    };
    let stem = swapped.rsplit_once('.').map_or(swapped.as_str(), |(a, _)| a);
    PathBuf::from(OsString::from(format!("{stem}.txt")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_path_rule() {
        assert_eq!(img2label_path(Path::new("/d/images/train/a.jpg")), PathBuf::from("/d/labels/train/a.txt"));
        assert_eq!(
            img2label_path(Path::new("/images/x/images/train/a.b.JPG")),
            PathBuf::from("/images/x/labels/train/a.b.txt")
        );
        assert_eq!(img2label_path(Path::new("/d/pics/a.png")), PathBuf::from("/d/pics/a.txt"));
    }

    #[test]
    fn url_splits_are_kept_as_written() {
        for u in ["s3://bucket/a.sluice", "gs://b/x", "az://c/y", "https://host/z.sluice", "s3a://b/k"] {
            assert!(is_url(u), "{u}");
        }
        for p in ["/data/train.sluice", "train.sluice", "C:\\data", "../x://y", "://x"] {
            assert!(!is_url(p), "{p}");
        }
        let y = Path::new("/nonexistent/d.yaml");
        let c = DataConfig::from_yaml_str("train: s3://b/coco/train.sluice\nval: ../val\nnames: [a]", y).unwrap();
        assert_eq!(c.train, vec![PathBuf::from("s3://b/coco/train.sluice")]);
        assert_eq!(c.train[0].to_str(), Some("s3://b/coco/train.sluice"));
        assert!(c.val[0].ends_with("val") && !is_url(&c.val[0].to_string_lossy()));
        let c =
            DataConfig::from_yaml_str("path: gs://b/coco/\ntrain: train.sluice\nval: [./val.sluice]\nnames: [a]", y)
                .unwrap();
        assert_eq!(c.train[0].to_str(), Some("gs://b/coco/train.sluice"));
        assert_eq!(c.val[0].to_str(), Some("gs://b/coco/val.sluice"));
    }

    #[test]
    fn names_list_map_and_nc() {
        let y = Path::new("/nonexistent/d.yaml");
        let c = DataConfig::from_yaml_str("train: a\nval: b\nnames: [cat, 1, true]", y).unwrap();
        assert_eq!(c.names, vec!["cat", "1", "True"]);
        let c = DataConfig::from_yaml_str("train: a\nval: b\nnames:\n  1: dog\n  '0': cat", y).unwrap();
        assert_eq!(c.names, vec!["cat", "dog"]);
        let c = DataConfig::from_yaml_str("train: a\nvalidation: b\nnc: 3", y).unwrap();
        assert_eq!(c.names, vec!["class_0", "class_1", "class_2"]);
        assert!(c.val[0].ends_with("b"));
        let e = c.image_files(Split::Test).unwrap_err();
        assert_eq!(e.to_string(), "/nonexistent/d.yaml: no 'test' split in this dataset YAML");
        let e = DataConfig::from_yaml_str("train: a\nval: b\nnames: [a]\nnc: 2", y).unwrap_err();
        assert!(e.to_string().contains("'names' length 1 and 'nc: 2' must match"), "{e}");
        let e = DataConfig::from_yaml_str("train: a\nval: b\nnames: {0: a, 2: b}", y).unwrap_err();
        assert!(e.to_string().contains("2-class dataset requires class indices 0-1"), "{e}");
        let e = DataConfig::from_yaml_str("train: a\nnames: [a]", y).unwrap_err();
        assert!(e.to_string().contains("'val:' key missing"), "{e}");
        assert!(DataConfig::from_yaml_str("train: a\nval: b", y).is_err());
        let e = DataConfig::from_yaml_str("train: [a\n", y).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/d.yaml: invalid YAML"), "{e}");
    }

    #[test]
    fn pure_parse_keeps_the_paths_as_written() {
        let y = Path::new("/nonexistent/d.yaml");
        let d = DataYaml::parse("path: ../ds\ntrain: images/tr\nval: [a, b]\ntest: ''\nnames: {0: x}", y).unwrap();
        assert_eq!(d.path.as_deref(), Some("../ds"));
        assert_eq!(d.train, SplitSpec::One("images/tr".into()));
        assert_eq!(d.val, SplitSpec::List(vec!["a".into(), "b".into()]));
        assert!(d.test.is_empty());
        assert_eq!(d.names, vec!["x"]);
        assert!(DataYaml::parse("train: a\nval: [b, 3]\nnc: 1", y).unwrap_err().to_string().contains("entries"));
        assert!(DataYaml::parse("- a", y).unwrap_err().to_string().contains("mapping"));
    }

    /// A huge `nc` without `names` made one name string per class: `nc: 1e15` allocated until killed.
    #[test]
    fn huge_nc_is_an_error_not_an_allocation() {
        let y = Path::new("/nonexistent/d.yaml");
        for nc in ["1e15", "1048577", "18446744073709551615", ".inf"] {
            let e = DataYaml::parse(&format!("train: a\nval: b\nnc: {nc}"), y).unwrap_err();
            assert!(e.to_string().contains("more than 1048576 classes"), "{nc}: {e}");
        }
        assert_eq!(DataYaml::parse("train: a\nval: b\nnc: 1048576", y).unwrap().names.len(), MAX_CLASSES);
        assert!(DataYaml::parse("train: a\nval: b\nnc: .nan", y).unwrap_err().to_string().contains("integer"));
    }

    #[test]
    fn root_and_split_paths() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(d.join("ds/images/tr")).unwrap();
        let y = d.join("cfg/data.yaml");
        std::fs::create_dir_all(d.join("cfg")).unwrap();
        // Relative `path` against the YAML's folder; `../` fallback for a missing split folder.
        let c = DataConfig::from_yaml_str("path: ../ds\ntrain: images/tr\nval: [images/tr, x.txt]\nnc: 1", &y).unwrap();
        assert_eq!(c.root, d.join("ds"));
        assert_eq!(c.train, vec![d.join("ds/images/tr")]);
        assert_eq!(c.val, vec![d.join("ds/images/tr"), d.join("ds/x.txt")]);
        let c = DataConfig::from_yaml_str("path: ../ds\ntrain: ../images/tr\nval: images/tr\nnc: 1", &y).unwrap();
        assert_eq!(c.train, vec![d.join("ds/images/tr")]);
        // No `path`: the YAML's folder. Absolute `path` as is.
        let c = DataConfig::from_yaml_str("train: t\nval: v\nnc: 1", &y).unwrap();
        assert_eq!(c.root, d.join("cfg"));
        let abs = format!("path: {}\ntrain: images/tr\nval: images/tr\nnc: 1", d.join("ds").display());
        assert_eq!(DataConfig::from_yaml_str(&abs, &y).unwrap().root, d.join("ds"));
    }

    #[test]
    fn image_listing_from_folders_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        for f in ["images/a/2.jpg", "images/a/sub/1.PNG", "images/a/.hidden.jpg", "images/a/notes.md", "images/b/3.jpg"]
        {
            let p = d.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        std::fs::write(d.join("list.txt"), "./images/b/3.jpg\n\n./images/a/2.jpg\n").unwrap();
        let got = list_images(&[d.join("images/a")], Path::new("y")).unwrap();
        assert_eq!(got, vec![d.join("images/a/2.jpg"), d.join("images/a/sub/1.PNG")]);
        let got = list_images(&[d.join("list.txt"), d.join("images/b")], Path::new("y")).unwrap();
        assert_eq!(got, vec![d.join("images/a/2.jpg"), d.join("images/b/3.jpg"), d.join("images/b/3.jpg")]);
        assert!(list_images(&[d.join("nope")], Path::new("y")).unwrap_err().to_string().contains("does not exist"));
        let e = list_images(&[PathBuf::from("s3://b/images")], Path::new("y")).unwrap_err().to_string();
        assert!(e.contains("s3://b/images is in object storage"), "{e}");
    }
}
