//! Ultralytics `.pt` checkpoints read without Python: the zip archive `torch.save` writes, its pickle parsed by
//! candle's pickle reader (`candle_core::pickle`), and the resulting object tree walked here. Ultralytics pickles a
//! whole `DetectionModel` (custom classes, `_modules` / `_parameters` / `_buffers` dicts), not a `state_dict`, so
//! the walk rebuilds the state-dict names (`model.0.conv.weight`, …) from the module tree, checks every module
//! class against the YOLOv8 detection layers, and reads the class names, the class count and the scale.

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use candle_core::pickle::{Object, Stack, TensorInfo};
use candle_core::{DType, Device, Tensor};

use crate::config::{Family, REG_MAX, Scale, YoloConfig};
use crate::error::{ModelError, Result};
use crate::model::Yolo;
use crate::weights::LoadMode;

/// The deepest module nesting walked; YOLOv8's is 5 (`model.2.m.0.cv1.conv`).
const MAX_DEPTH: usize = 16;

/// The module classes of a YOLOv8 detection model (Ultralytics' and torch's), fused or not.
const V8_CLASSES: &[&str] = &[
    "DetectionModel",
    "Sequential",
    "ModuleList",
    "Conv",
    "Conv2d",
    "BatchNorm2d",
    "SiLU",
    "Identity",
    "C2f",
    "Bottleneck",
    "SPPF",
    "MaxPool2d",
    "Upsample",
    "Concat",
    "Detect",
    "DFL",
];

/// Heads of other tasks, with the task's name for the error.
const OTHER_TASKS: &[(&str, &str)] = &[
    ("Segment", "segmentation"),
    ("Segment26", "segmentation"),
    ("Pose", "pose"),
    ("Pose26", "pose"),
    ("Classify", "classification"),
    ("OBB", "oriented-box (OBB)"),
    ("OBB26", "oriented-box (OBB)"),
    ("WorldDetect", "open-vocabulary (YOLO-World)"),
    ("YOLOEDetect", "open-vocabulary (YOLOE)"),
    ("RTDETRDecoder", "RT-DETR"),
];

/// The module classes YOLO11 adds to YOLOv8's.
const V11_CLASSES: &[&str] = &["C3k2", "C3k", "C2PSA", "PSABlock", "Attention", "DWConv"];

/// Blocks that mark a YOLO family Sluice does not build, with the family's name for the error.
const OTHER_FAMILIES: &[(&str, &str)] = &[
    ("A2C2f", "YOLO12"),
    ("v10Detect", "YOLOv10"),
    ("SCDown", "YOLOv10"),
    ("PSA", "YOLOv10"),
    ("C2fCIB", "YOLOv10"),
    ("RepNCSPELAN4", "YOLOv9"),
    ("ADown", "YOLOv9"),
    ("C3", "YOLOv5"),
];

/// What an Ultralytics checkpoint holds for Sluice: the detection model's `state_dict` and its description.
#[derive(Debug, Clone)]
pub struct PtCheckpoint {
    /// The file it was read from.
    pub file: PathBuf,
    /// `ema` or `model`: which entry held the weights (the EMA when the trainer saved one, as Ultralytics picks).
    pub entry: &'static str,
    /// The state dict under Ultralytics' key names, in the stored dtype (float16 in Ultralytics' own files).
    pub tensors: HashMap<String, Tensor>,
    /// The class names by index (`names`; `"0"`, `"1"`, … when the checkpoint has none, as Ultralytics does).
    pub names: Vec<String>,
    /// The class count of the Detect head.
    pub nc: usize,
    /// The scale from the model's `yaml` (`scales[scale]`, or `depth_multiple` / `width_multiple`).
    pub scale: Scale,
    /// The family, from the module classes (C3k2 and C2PSA make a YOLO11).
    pub family: Family,
    /// The dtype the floating-point weights are stored in.
    pub dtype: DType,
}

impl PtCheckpoint {
    /// The model's architecture.
    pub fn config(&self) -> YoloConfig {
        let cfg = YoloConfig::new(self.scale, self.nc).with_family(self.family);
        let shapes = self.tensors.iter().map(|(k, t)| (k.as_str(), t.dims()));
        match crate::weights::cls_width_of(shapes) {
            Some(w) => cfg.with_cls_width(w),
            None => cfg,
        }
    }
}

/// Whether a path names a PyTorch checkpoint (`.pt` / `.pth`), which the weight loaders read with [`read_pt`].
pub fn is_pt(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("pt") || e == "pth")
}

/// Reads an Ultralytics checkpoint file.
pub fn read_pt(path: impl AsRef<Path>) -> Result<PtCheckpoint> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
    read_pt_bytes(&bytes, path)
}

/// Reads an Ultralytics checkpoint from memory; `origin` names it in errors.
pub fn read_pt_bytes(bytes: &[u8], origin: &Path) -> Result<PtCheckpoint> {
    let bad = |reason: String| ModelError::Pt { file: origin.to_path_buf(), reason };
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| bad(format!("not a readable PyTorch zip archive (truncated or not a .pt file?): {e}")))?;
    let pkl = (0..zip.len())
        .filter_map(|i| zip.name_for_index(i).and_then(|n| n.ok()).map(|n| n.into_owned()))
        .find(|n| n.ends_with("/data.pkl") || n == "data.pkl")
        .ok_or_else(|| bad("no data.pkl in the archive: not a torch.save file".into()))?;
    let dir = pkl.strip_suffix("data.pkl").unwrap_or("").to_string();
    let pickle = read_entry(&mut zip, &pkl, None).map_err(&bad)?;
    let mut stack = Stack::empty();
    stack.read_loop(&mut Cursor::new(&pickle)).map_err(|e| bad(format!("unreadable pickle in {pkl}: {e}")))?;
    let root = stack.finalize().map_err(|e| bad(format!("unreadable pickle in {pkl}: {e}")))?;
    let Object::Dict(entries) = root else {
        return Err(bad(format!("the pickle holds {}, not an Ultralytics checkpoint dict", describe(&root))));
    };
    let get = |key: &str| entries.iter().find(|(k, _)| matches!(k, Object::Unicode(s) if s == key)).map(|(_, v)| v);
    let (entry, module) = match (get("ema"), get("model")) {
        (Some(m), _) if !matches!(m, Object::None) => ("ema", m),
        (_, Some(m)) if !matches!(m, Object::None) => ("model", m),
        _ => return Err(bad("neither `ema` nor `model` holds a model: not an Ultralytics checkpoint".into())),
    };
    let mut walk = Walk { infos: Vec::new(), classes: Vec::new() };
    let root_state = module_state(module).map_err(|e| bad(format!("`{entry}`: {e}")))?;
    walk.module(module, "", 0).map_err(|e| bad(format!("`{entry}`: {e}")))?;
    let family = check_classes(&walk.classes).map_err(&bad)?;
    if walk.classes.iter().any(|c| c == "Conv") && !walk.infos.iter().any(|i| i.name.contains(".bn.")) {
        return Err(bad(
            "a fused model (Conv+BN folded by fuse()): Sluice reads unfused weights; use the checkpoint as saved by \
             training or YOLO.save"
                .into(),
        ));
    }
    let nc = detect_nc(module).map_err(&bad)?;
    let names = class_names(root_state, nc).map_err(&bad)?;
    let scale = scale_of(root_state).map_err(&bad)?;
    let family = check_head(root_state, family).map_err(&bad)?;
    let mut tensors = HashMap::with_capacity(walk.infos.len());
    let mut dtype = DType::F32;
    for info in &walk.infos {
        let t = load_tensor(&mut zip, &dir, info).map_err(|e| bad(format!("tensor `{}`: {e}", info.name)))?;
        if t.dtype().is_float() {
            dtype = t.dtype();
        }
        tensors.insert(info.name.clone(), t);
    }
    Ok(PtCheckpoint { file: origin.to_path_buf(), entry, tensors, names, nc, scale, family, dtype })
}

impl Yolo {
    /// The model an Ultralytics checkpoint holds, with its architecture, class count and weights (float16
    /// weights widen exactly to `dtype`).
    pub fn from_pt(path: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<(Self, PtCheckpoint)> {
        let ckpt = read_pt(path)?;
        let mut m = Self::new(ckpt.config(), dtype, device)?;
        m.load_state_dict(&ckpt.tensors, LoadMode::Strict, &ckpt.file)?;
        Ok((m, ckpt))
    }

    /// Overwrites the model's parameters with those of an Ultralytics checkpoint, after checking that its family
    /// and class count are this model's (a scale that differs fails on the first shape).
    pub(crate) fn load_pt(&mut self, path: &Path, mode: LoadMode) -> Result<()> {
        let ckpt = read_pt(path)?;
        let cfg = self.config();
        if ckpt.family != cfg.family {
            return Err(ModelError::Pt {
                file: path.to_path_buf(),
                reason: format!("a {} model, this one is a {}", ckpt.config().name(), cfg.name()),
            });
        }
        if ckpt.nc != cfg.nc {
            let shown: Vec<&str> = ckpt.names.iter().take(3).map(String::as_str).collect();
            return Err(ModelError::Pt {
                file: path.to_path_buf(),
                reason: format!(
                    "a model for {} classes ({}{}), this one has {} (wrong --nc or dataset?)",
                    ckpt.nc,
                    shown.join(", "),
                    if ckpt.names.len() > 3 { ", …" } else { "" },
                    cfg.nc
                ),
            });
        }
        self.load_state_dict(&ckpt.tensors, mode, path)
    }
}

/// The tensors and module classes found by the walk.
struct Walk {
    infos: Vec<TensorInfo>,
    classes: Vec<String>,
}

impl Walk {
    /// Records the parameters and buffers of `obj` (a pickled `nn.Module`) under `prefix`, then its children.
    fn module(&mut self, obj: &Object, prefix: &str, depth: usize) -> std::result::Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("modules nested deeper than {MAX_DEPTH} at `{prefix}`"));
        }
        let (module_name, class_name) = class_of(obj)?;
        if !module_name.starts_with("ultralytics.") && !module_name.starts_with("torch.nn.") {
            return Err(format!("unknown module class {module_name}.{class_name} at `{prefix}`"));
        }
        self.classes.push(class_name.to_string());
        let state = module_state(obj)?;
        for field in ["_parameters", "_buffers"] {
            for (k, v) in dict_field(state, field)? {
                if matches!(v, Object::None) {
                    continue;
                }
                let name = format!("{prefix}{}", unicode(k)?);
                match v.clone().into_tensor_info(Object::Unicode(name.clone()), Path::new("")) {
                    Ok(Some(info)) => self.infos.push(info),
                    Ok(None) => return Err(format!("`{name}` is {}, not a tensor", describe(v))),
                    Err(e) => return Err(format!("`{name}`: {e}")),
                }
            }
        }
        for (k, v) in dict_field(state, "_modules")? {
            if matches!(v, Object::None) {
                continue;
            }
            self.module(v, &format!("{prefix}{}.", unicode(k)?), depth + 1)?;
        }
        Ok(())
    }
}

/// `(module, class)` of a pickled object built by `NEWOBJ` / `REDUCE` + `BUILD`, or of a later reference to one
/// (see [`module_state`]).
fn class_of(obj: &Object) -> std::result::Result<(&str, &str), String> {
    let callable = match obj {
        Object::Build { callable, .. } => callable.as_ref(),
        Object::Reduce { .. } => obj,
        other => return Err(format!("{} where a module was expected", describe(other))),
    };
    match callable {
        Object::Reduce { callable, .. } => match callable.as_ref() {
            Object::Class { module_name, class_name } => Ok((module_name, class_name)),
            other => Err(format!("a module built by {}", describe(other))),
        },
        other => Err(format!("a module built from {}", describe(other))),
    }
}

/// The `__dict__` of a pickled module. A module pickled twice (Ultralytics' Conv blocks share one `SiLU`) comes back
/// the second time from candle's memo as it was when memoised, before its state was set: it has no state here, and
/// a module with parameters in that position shows up as a missing key when the weights are loaded.
fn module_state(obj: &Object) -> std::result::Result<&[(Object, Object)], String> {
    match obj {
        Object::Build { args, .. } => match args.as_ref() {
            Object::Dict(d) => Ok(d),
            other => Err(format!("a module whose state is {}", describe(other))),
        },
        Object::Reduce { .. } => Ok(&[]),
        other => Err(format!("{} where a module was expected", describe(other))),
    }
}

fn field<'a>(state: &'a [(Object, Object)], key: &str) -> Option<&'a Object> {
    state.iter().find(|(k, _)| matches!(k, Object::Unicode(s) if s == key)).map(|(_, v)| v)
}

/// A dict attribute of a module's state (an empty one when absent).
fn dict_field<'a>(state: &'a [(Object, Object)], key: &str) -> std::result::Result<&'a [(Object, Object)], String> {
    match field(state, key) {
        None => Ok(&[]),
        Some(Object::Dict(d)) => Ok(d),
        Some(other) => Err(format!("`{key}` is {}, not a dict", describe(other))),
    }
}

fn unicode(o: &Object) -> std::result::Result<&str, String> {
    match o {
        Object::Unicode(s) => Ok(s),
        other => Err(format!("a key that is {}, not a string", describe(other))),
    }
}

fn int(o: &Object) -> Option<i64> {
    match o {
        Object::Int(i) => Some(i64::from(*i)),
        Object::Long(i) => Some(*i),
        _ => None,
    }
}

fn float(o: &Object) -> Option<f64> {
    match o {
        Object::Float(f) => Some(*f),
        o => int(o).map(|i| i as f64),
    }
}

/// A short description of a pickled object for error messages (never its whole contents).
fn describe(o: &Object) -> String {
    match o {
        Object::Class { module_name, class_name } => format!("the class {module_name}.{class_name}"),
        Object::Int(_) | Object::Long(_) => "an integer".into(),
        Object::Float(_) => "a float".into(),
        Object::Unicode(_) => "a string".into(),
        Object::Bool(_) => "a bool".into(),
        Object::None => "None".into(),
        Object::Tuple(_) => "a tuple".into(),
        Object::List(_) => "a list".into(),
        Object::Mark => "a mark".into(),
        Object::Dict(_) => "a dict".into(),
        Object::Reduce { callable, .. } | Object::Build { callable, .. } => match callable.as_ref() {
            Object::Class { module_name, class_name } => format!("an object of {module_name}.{class_name}"),
            Object::Reduce { callable, .. } => match callable.as_ref() {
                Object::Class { module_name, class_name } => format!("an object of {module_name}.{class_name}"),
                _ => "an object".into(),
            },
            _ => "an object".into(),
        },
        Object::PersistentLoad(_) => "a persistent id".into(),
    }
}

/// Refuses a model of another task or family, or with a layer YOLOv8 / YOLO11 detection does not have; returns
/// the family.
fn check_classes(classes: &[String]) -> std::result::Result<Family, String> {
    for c in classes {
        if let Some((_, task)) = OTHER_TASKS.iter().find(|(n, _)| n == c) {
            return Err(format!("a {task} model ({c} head): Sluice trains and exports detection models only"));
        }
    }
    for c in classes {
        if let Some((_, family)) = OTHER_FAMILIES.iter().find(|(n, _)| n == c) {
            return Err(format!(
                "family not supported: a {family} model ({c} layers); Sluice builds YOLOv8, YOLO11 and YOLO26"
            ));
        }
    }
    let v11 = classes.iter().any(|c| c == "C3k2" || c == "C2PSA");
    let known = |c: &str| V8_CLASSES.contains(&c) || (v11 && V11_CLASSES.contains(&c));
    match classes.iter().find(|c| !known(c.as_str())) {
        Some(c) => Err(format!(
            "family not supported: a `{c}` layer, which {} detection does not have",
            if v11 { "YOLO11" } else { "YOLOv8" }
        )),
        None if !classes.iter().any(|c| c == "Detect") => Err("no Detect head in the model".into()),
        None if v11 => Ok(Family::V11),
        None => Ok(Family::V8),
    }
}

/// The family once the model's `yaml` is read: a YOLO11 table with `end2end: True` and `reg_max: 1` is a YOLO26;
/// any other end-to-end head or `reg_max` is refused before a layer is built.
fn check_head(state: &[(Object, Object)], family: Family) -> std::result::Result<Family, String> {
    let Some(Object::Dict(yaml)) = field(state, "yaml") else { return Ok(family) };
    let end2end = matches!(field(yaml, "end2end"), Some(Object::Bool(true)));
    let reg_max = field(yaml, "reg_max").and_then(float).unwrap_or(REG_MAX as f64);
    match (family, end2end, reg_max) {
        (Family::V11, true, 1.0) => Ok(Family::V26),
        (_, true, _) => Err(format!(
            "family not supported: an end-to-end model (`end2end: True`, reg_max {reg_max}) that is not a YOLO26; \
             Sluice builds YOLOv8, YOLO11 and YOLO26"
        )),
        (_, false, r) if r != REG_MAX as f64 => {
            Err(format!("family not supported: `reg_max: {r}` (Sluice's Detect head has {REG_MAX} DFL bins)"))
        }
        _ => Ok(family),
    }
}

/// The `Detect` module's `nc`.
fn detect_nc(model: &Object) -> std::result::Result<usize, String> {
    fn find(obj: &Object, depth: usize) -> Option<i64> {
        if depth > MAX_DEPTH {
            return None;
        }
        let state = module_state(obj).ok()?;
        if class_of(obj).ok()?.1 == "Detect" {
            return field(state, "nc").and_then(int);
        }
        dict_field(state, "_modules").ok()?.iter().find_map(|(_, v)| find(v, depth + 1))
    }
    match find(model, 0) {
        Some(n) if (1..=1 << 20).contains(&n) => Ok(n as usize),
        Some(n) => Err(format!("Detect head with nc {n}")),
        None => Err("no class count (`nc`) on the Detect head".into()),
    }
}

/// `names` of the model (a dict index → name, or a list), checked against `nc`.
fn class_names(state: &[(Object, Object)], nc: usize) -> std::result::Result<Vec<String>, String> {
    let mut names: Vec<Option<String>> = vec![None; nc];
    match field(state, "names") {
        None | Some(Object::None) => {}
        Some(Object::Dict(d)) => {
            for (k, v) in d {
                let i = int(k).ok_or_else(|| format!("`names` has a key that is {}", describe(k)))?;
                let slot = usize::try_from(i)
                    .ok()
                    .and_then(|i| names.get_mut(i))
                    .ok_or_else(|| format!("`names` has index {i}, the Detect head has {nc} classes"))?;
                *slot = Some(unicode(v)?.to_string());
            }
        }
        Some(Object::List(l)) => {
            if l.len() != nc {
                return Err(format!("{} names for {nc} classes", l.len()));
            }
            for (slot, v) in names.iter_mut().zip(l) {
                *slot = Some(unicode(v)?.to_string());
            }
        }
        Some(other) => return Err(format!("`names` is {}", describe(other))),
    }
    Ok(names.into_iter().enumerate().map(|(i, n)| n.unwrap_or_else(|| i.to_string())).collect())
}

/// The scale from the model's `yaml` dict: `scales[scale]` = `[depth, width, max_channels]`, or the legacy
/// `depth_multiple` / `width_multiple`.
fn scale_of(state: &[(Object, Object)]) -> std::result::Result<Scale, String> {
    let Some(Object::Dict(yaml)) = field(state, "yaml") else {
        return Err("no `yaml` dict on the model: its architecture is unknown".into());
    };
    let named = match field(yaml, "scale") {
        Some(Object::Unicode(s)) if !s.is_empty() => Some(s.as_str()),
        _ => None,
    };
    let (d, w, c) = match field(yaml, "scales") {
        Some(Object::Dict(scales)) if !scales.is_empty() => {
            // As Ultralytics' `parse_model`: a model YAML whose file name names no scale takes the first one listed.
            let (s, v) = match named {
                Some(s) => (s, field(scales, s)),
                None => (
                    scales.first().and_then(|(k, _)| unicode(k).ok()).unwrap_or_default(),
                    scales.first().map(|(_, v)| v),
                ),
            };
            let Some(Object::List(v)) = v else {
                return Err(format!("`yaml.scales` has no scale `{s}`"));
            };
            let f: Vec<f64> = v.iter().filter_map(float).collect();
            match f[..] {
                [d, w, c] => (d, w, c),
                _ => return Err(format!("`yaml.scales.{s}` is not [depth, width, max_channels]")),
            }
        }
        _ => {
            let get = |k| field(yaml, k).and_then(float);
            match (get("depth_multiple"), get("width_multiple")) {
                (Some(d), Some(w)) => (d, w, get("max_channels").unwrap_or(1024.0)),
                _ => return Err("`yaml` gives neither `scales` + `scale` nor depth/width multiples".into()),
            }
        }
    };
    if !(c.is_finite() && c >= 0.0) {
        return Err(format!("max_channels {c}"));
    }
    let custom = Scale::custom(d, w, c as usize).map_err(|e| e.to_string())?;
    // The five named scales, when the multipliers are theirs.
    Ok([Scale::N, Scale::S, Scale::M, Scale::L, Scale::X]
        .into_iter()
        .find(|s| Scale::custom(s.multipliers().0, s.multipliers().1, s.multipliers().2).ok() == Some(custom))
        .unwrap_or(custom))
}

/// The bytes of a zip entry, at most `limit` of them when given.
fn read_entry(
    zip: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    limit: Option<u64>,
) -> std::result::Result<Vec<u8>, String> {
    let mut f = zip.by_name(name).map_err(|e| format!("zip entry {name}: {e}"))?;
    let size = f.size();
    let mut buf = Vec::with_capacity(usize::try_from(size.min(limit.unwrap_or(size)).min(1 << 30)).unwrap_or(0));
    let r = match limit {
        Some(n) => f.by_ref().take(n).read_to_end(&mut buf),
        None => f.read_to_end(&mut buf),
    };
    r.map_err(|e| format!("zip entry {name}: {e} (truncated file?)"))?;
    Ok(buf)
}

/// One tensor from its storage entry (`<archive>/data/<key>`); only contiguous layouts, as torch saves parameters.
fn load_tensor(
    zip: &mut zip::ZipArchive<Cursor<&[u8]>>,
    dir: &str,
    info: &TensorInfo,
) -> std::result::Result<Tensor, String> {
    let layout = &info.layout;
    if !layout.is_contiguous() {
        return Err(format!("a non-contiguous layout {:?}", layout.stride()));
    }
    let elems = layout.dims().iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let start = layout.start_offset();
    let bytes = elems.and_then(|n| n.checked_mul(info.dtype.size_in_bytes()));
    let Some(end) = bytes.and_then(|b| b.checked_add(start)) else {
        return Err(format!("shape {:?} overflows", layout.dims()));
    };
    // `path` is `/<storage key>` (the walk passes an empty folder); the storage lives under `<archive>/data/`.
    let key = info.path.trim_start_matches('/');
    let name = format!("{dir}data/{key}");
    let data = read_entry(zip, &name, Some(end as u64))?;
    if data.len() < end {
        return Err(format!("storage {name} has {} bytes, the tensor needs {end} (truncated file?)", data.len()));
    }
    Tensor::from_raw_buffer(&data[start..end], info.dtype, layout.dims(), &Device::Cpu).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(scale: Option<&str>) -> Vec<(Object, Object)> {
        let s = |x: &str| Object::Unicode(x.to_string());
        let list = |v: [f64; 3]| Object::List(v.iter().map(|&f| Object::Float(f)).collect());
        let mut d = vec![(
            s("scales"),
            Object::Dict(vec![(s("t"), list([0.33, 0.125, 1024.0])), (s("n"), list([0.33, 0.25, 1024.0]))]),
        )];
        if let Some(x) = scale {
            d.push((s("scale"), s(x)));
        }
        vec![(s("yaml"), Object::Dict(d))]
    }

    /// A model YAML whose file name names no scale (`yolov8t.yaml` → `scale: ''`) takes the first scale listed,
    /// as Ultralytics' `parse_model` does; a named scale is taken, an unknown one is an error.
    #[test]
    fn the_scale_is_the_named_one_else_the_first() {
        let width = |s: Scale| s.multipliers().1;
        assert_eq!(scale_of(&yaml(Some(""))).map(width), Ok(0.125));
        assert_eq!(scale_of(&yaml(None)).map(width), Ok(0.125));
        assert_eq!(scale_of(&yaml(Some("n"))).map(width), Ok(0.25));
        assert!(scale_of(&yaml(Some("q"))).unwrap_err().contains("no scale `q`"));
    }
}
