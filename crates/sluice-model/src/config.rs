//! The model families (YOLOv8, YOLO11), their scales (depth, width, max channels from Ultralytics' `yolov8.yaml` and
//! `yolo11.yaml`), custom multipliers from a model YAML, and the channel arithmetic.

use std::path::Path;

use crate::error::{ModelError, Result};

/// Depth and width multipliers and the channel cap of a custom scale, in thousandths (so the type stays `Eq` and
/// `Hash`): `depth_multiple: 0.33` is `depth_milli: 330`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CustomScale {
    /// `depth_multiple` × 1000.
    pub depth_milli: u32,
    /// `width_multiple` × 1000.
    pub width_milli: u32,
    /// `max_channels`.
    pub max_channels: usize,
}

/// One of the five YOLOv8 scales, or custom multipliers of the same architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scale {
    /// yolov8n: depth 0.33, width 0.25, max channels 1024.
    N,
    /// yolov8s: depth 0.33, width 0.50, max channels 1024.
    S,
    /// yolov8m: depth 0.67, width 0.75, max channels 768.
    M,
    /// yolov8l: depth 1.00, width 1.00, max channels 512.
    L,
    /// yolov8x: depth 1.00, width 1.25, max channels 512.
    X,
    /// The YOLOv8 architecture with other multipliers (a model YAML's `depth_multiple`, `width_multiple`,
    /// `max_channels`, as Ultralytics reads them).
    Custom(CustomScale),
}

impl Scale {
    /// `(depth, width, max_channels)` as in `yolov8.yaml`.
    pub fn multipliers(self) -> (f64, f64, usize) {
        match self {
            Scale::N => (0.33, 0.25, 1024),
            Scale::S => (0.33, 0.50, 1024),
            Scale::M => (0.67, 0.75, 768),
            Scale::L => (1.00, 1.00, 512),
            Scale::X => (1.00, 1.25, 512),
            Scale::Custom(c) => (f64::from(c.depth_milli) / 1000.0, f64::from(c.width_milli) / 1000.0, c.max_channels),
        }
    }

    /// A custom scale; multipliers must be in (0, 4] and are kept to three decimals.
    pub fn custom(depth: f64, width: f64, max_channels: usize) -> Result<Self> {
        let milli = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= 4.0 {
                Ok((v * 1000.0).round() as u32)
            } else {
                Err(ModelError::BadInput(format!("{name} {v} must be in (0, 4]")))
            }
        };
        if !(8..=4096).contains(&max_channels) {
            return Err(ModelError::BadInput(format!("max_channels {max_channels} must be in 8..=4096")));
        }
        Ok(Scale::Custom(CustomScale {
            depth_milli: milli("depth_multiple", depth)?,
            width_milli: milli("width_multiple", width)?,
            max_channels,
        }))
    }

    /// Parses `n`, `yolov8n`, `N`, … .
    pub fn parse(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        let s = lower.strip_prefix("yolov8").unwrap_or(&lower);
        match s {
            "n" => Ok(Scale::N),
            "s" => Ok(Scale::S),
            "m" => Ok(Scale::M),
            "l" => Ok(Scale::L),
            "x" => Ok(Scale::X),
            _ => Err(ModelError::UnknownModel(name.to_string())),
        }
    }

    /// The scale a `model` value names: `yolov8n` … `yolov8x` (with or without `.yaml`, as Ultralytics accepts
    /// them), or the path of an existing model YAML holding `depth_multiple`, `width_multiple` and optionally
    /// `max_channels` (default 1024) for the YOLOv8 architecture. A YAML that also gives `backbone` or `head` is
    /// refused: Sluice builds only the YOLOv8 layer table and would silently train something else.
    pub fn from_model(model: &str) -> Result<Self> {
        let path = Path::new(model);
        let is_yaml = model.ends_with(".yaml") || model.ends_with(".yml");
        if is_yaml && path.is_file() {
            let text =
                std::fs::read_to_string(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
            return Self::from_model_yaml(&text).map_err(|e| ModelError::BadInput(format!("{}: {e}", path.display())));
        }
        let name = model.trim_end_matches(".yaml").trim_end_matches(".yml");
        let name = path
            .file_name()
            .and_then(|s| s.to_str())
            .map_or(name, |f| f.trim_end_matches(".yaml").trim_end_matches(".yml"));
        Self::parse(name)
    }

    /// Parses a model YAML's multipliers (see [`Scale::from_model`]).
    pub fn from_model_yaml(text: &str) -> std::result::Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct ModelYaml {
            depth_multiple: Option<f64>,
            width_multiple: Option<f64>,
            max_channels: Option<usize>,
            backbone: Option<serde_yaml_ng::Value>,
            head: Option<serde_yaml_ng::Value>,
            scales: Option<serde_yaml_ng::Value>,
        }
        let y: ModelYaml = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        for (key, present) in
            [("backbone", y.backbone.is_some()), ("head", y.head.is_some()), ("scales", y.scales.is_some())]
        {
            if present {
                return Err(format!(
                    "`{key}` is not supported: Sluice builds its families' own layer tables and takes only \
                     depth_multiple, width_multiple, max_channels and family from a model YAML"
                ));
            }
        }
        let depth = y.depth_multiple.ok_or("no depth_multiple")?;
        let width = y.width_multiple.ok_or("no width_multiple")?;
        Self::custom(depth, width, y.max_channels.unwrap_or(1024)).map_err(|e| e.to_string())
    }

    /// The model's name: `yolov8n` … `yolov8x`, or `yolov8(d0.33,w0.125,c1024)` for a custom scale.
    pub fn name(self) -> String {
        match self {
            Scale::N => "yolov8n".into(),
            Scale::S => "yolov8s".into(),
            Scale::M => "yolov8m".into(),
            Scale::L => "yolov8l".into(),
            Scale::X => "yolov8x".into(),
            Scale::Custom(_) => {
                let (d, w, c) = self.multipliers();
                format!("yolov8(d{d},w{w},c{c})")
            }
        }
    }
}

/// The layer table a model is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Family {
    /// `yolov8.yaml`: C2f blocks, SPPF, the legacy Detect head (two 3×3 Convs per class branch).
    #[default]
    V8,
    /// `yolo11.yaml`: C3k2 blocks (C3k inside where the table or the scale asks), SPPF then C2PSA (attention),
    /// the Detect head with depthwise convolutions in its class branch.
    V11,
    /// `yolo26.yaml`: YOLO11's table with C3k inside every C3k2 of the neck, a PSABlock inside the last one, an
    /// SPPF without activation on its first Conv and with a residual, and an end-to-end Detect head: `reg_max` 1
    /// (no DFL) and a one-to-one copy of both branches, whose top-k output needs no NMS.
    V26,
}

impl Family {
    /// The name prefix Ultralytics gives the family's models (`yolov8`, `yolo11`).
    pub fn prefix(self) -> &'static str {
        match self {
            Family::V8 => "yolov8",
            Family::V11 => "yolo11",
            Family::V26 => "yolo26",
        }
    }

    /// The row of the Detect head in the layer table (`model.<i>`).
    pub fn detect_index(self) -> usize {
        match self {
            Family::V8 => 22,
            Family::V11 | Family::V26 => 23,
        }
    }

    /// The top-level layers whose outputs feed the Detect head (P3, P4, P5).
    pub fn detect_from(self) -> [usize; 3] {
        match self {
            Family::V8 => [15, 18, 21],
            Family::V11 | Family::V26 => [16, 19, 22],
        }
    }

    /// DFL bins per box side: 16, or 1 in YOLO26 (the box branch gives the four distances directly).
    pub fn reg_max(self) -> usize {
        match self {
            Family::V8 | Family::V11 => REG_MAX,
            Family::V26 => 1,
        }
    }

    /// Whether the Detect head has a one-to-one branch (end-to-end detection without NMS).
    pub fn end2end(self) -> bool {
        self == Family::V26
    }

    /// `(depth, width, max_channels)` of a named scale in this family's YAML (custom scales give their own).
    pub fn multipliers(self, scale: Scale) -> (f64, f64, usize) {
        match (self, scale) {
            (Family::V11 | Family::V26, Scale::N) => (0.50, 0.25, 1024),
            (Family::V11 | Family::V26, Scale::S) => (0.50, 0.50, 1024),
            (Family::V11 | Family::V26, Scale::M) => (0.50, 1.00, 512),
            (Family::V11 | Family::V26, Scale::L) => (1.00, 1.00, 512),
            (Family::V11 | Family::V26, Scale::X) => (1.00, 1.50, 512),
            (_, s) => s.multipliers(),
        }
    }

    /// The model's name: `yolov8n`, `yolo11s`, … or the multipliers of a custom scale.
    pub fn model_name(self, scale: Scale) -> String {
        match scale {
            Scale::Custom(_) => {
                let (d, w, c) = scale.multipliers();
                format!("{}(d{d},w{w},c{c})", self.prefix())
            }
            named => format!("{}{}", self.prefix(), named.name().trim_start_matches("yolov8")),
        }
    }
}

/// A family and a scale: what a model's name gives before the class count is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    /// The layer table.
    pub family: Family,
    /// The scale.
    pub scale: Scale,
}

impl Arch {
    /// YOLOv8 at this scale.
    pub fn v8(scale: Scale) -> Self {
        Self { family: Family::V8, scale }
    }

    /// The model's configuration for `nc` classes.
    pub fn config(self, nc: usize) -> YoloConfig {
        YoloConfig { scale: self.scale, nc, family: self.family, cls_width: None }
    }

    /// The model's name (`yolov8n`, `yolo11s`, …).
    pub fn name(self) -> String {
        self.family.model_name(self.scale)
    }
}

/// A model named as Ultralytics names it: `yolov8n`, `yolo11s.yaml`, or a model YAML's path. Returns the family
/// and the scale. A YAML gives `depth_multiple` and `width_multiple` (and optionally `max_channels`, default 1024)
/// and may name its family with `family: yolo11` (default YOLOv8); a YAML that gives `backbone` or `head` is
/// refused, because Sluice builds its families' own layer tables and would silently train something else.
pub fn parse_model(model: &str) -> Result<Arch> {
    let path = Path::new(model);
    let is_yaml = model.ends_with(".yaml") || model.ends_with(".yml");
    if is_yaml && path.is_file() {
        let text =
            std::fs::read_to_string(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
        return parse_model_yaml(&text)
            .map(|(family, scale)| Arch { family, scale })
            .map_err(|e| ModelError::BadInput(format!("{}: {e}", path.display())));
    }
    let name = path.file_name().and_then(|s| s.to_str()).unwrap_or(model);
    let name = name.trim_end_matches(".yaml").trim_end_matches(".yml").to_ascii_lowercase();
    for family in [Family::V11, Family::V26] {
        if let Some(s) = name.strip_prefix(family.prefix()) {
            let scale = Scale::parse(s).map_err(|_| ModelError::UnknownModel(model.to_string()))?;
            return Ok(Arch { family, scale });
        }
    }
    Ok(Arch::v8(Scale::parse(&name).map_err(|_| ModelError::UnknownModel(model.to_string()))?))
}

/// Parses a model YAML's family and multipliers (see [`parse_model`]).
pub fn parse_model_yaml(text: &str) -> std::result::Result<(Family, Scale), String> {
    #[derive(serde::Deserialize)]
    struct FamilyYaml {
        family: Option<String>,
    }
    let f: FamilyYaml = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let family = match f.family.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("yolov8") => Family::V8,
        Some("yolo11") => Family::V11,
        Some("yolo26") => Family::V26,
        Some(other) => return Err(format!("family `{other}` is not one Sluice builds (yolov8, yolo11, yolo26)")),
    };
    Ok((family, Scale::from_model_yaml(text)?))
}

/// Architecture of one detection model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YoloConfig {
    /// The scale.
    pub scale: Scale,
    /// Number of classes.
    pub nc: usize,
    /// The layer table.
    pub family: Family,
    /// Hidden channels of the class branch when they are not Ultralytics' `max(ch[0], min(nc, 100))`: Ultralytics
    /// 8.4 keeps the source model's width when it fine-tunes weights for another class count (the pretrained
    /// hidden layers transfer; only the last convolution is new), so such a model's width follows its weights
    /// ([`YoloConfig::with_cls_width`], [`crate::weights::cls_width_of`]). `None`: the formula.
    pub cls_width: Option<usize>,
}

/// DFL bins per box side.
pub const REG_MAX: usize = 16;
/// Strides of the three detection levels P3, P4, P5.
pub const STRIDES: [usize; 3] = [8, 16, 32];

impl YoloConfig {
    /// A YOLOv8 configuration.
    pub fn new(scale: Scale, nc: usize) -> Self {
        Self { scale, nc, family: Family::V8, cls_width: None }
    }

    /// The same model with class-branch hidden width `width` (kept as `None` when it is the formula's).
    pub fn with_cls_width(self, width: usize) -> Self {
        let formula = Self { cls_width: None, ..self }.cls_hidden();
        Self { cls_width: (width != formula).then_some(width), ..self }
    }

    /// The same scale and class count in another family.
    pub fn with_family(self, family: Family) -> Self {
        Self { family, ..self }
    }

    /// The configuration a model name or YAML gives (see [`parse_model`]).
    pub fn from_model(model: &str, nc: usize) -> Result<Self> {
        Ok(parse_model(model)?.config(nc))
    }

    /// The model's name (`yolov8n`, `yolo11s`, …).
    pub fn name(&self) -> String {
        self.family.model_name(self.scale)
    }

    /// The family and scale.
    pub fn arch(&self) -> Arch {
        Arch { family: self.family, scale: self.scale }
    }

    /// `(depth, width, max_channels)`.
    pub fn multipliers(&self) -> (f64, f64, usize) {
        self.family.multipliers(self.scale)
    }

    /// Output channels of a layer whose yaml row asks for `c` (Ultralytics `make_divisible(min(c, max) * width, 8)`).
    pub fn ch(&self, c: usize) -> usize {
        let (_, width, max_ch) = self.multipliers();
        let x = c.min(max_ch) as f64 * width;
        ((x / 8.0).ceil() as usize) * 8
    }

    /// Repeats of a block whose yaml row asks for `n` (Ultralytics `max(round(n * depth), 1)`).
    pub fn depth(&self, n: usize) -> usize {
        let (depth, _, _) = self.multipliers();
        if n > 1 { ((n as f64 * depth).round() as usize).max(1) } else { n }
    }

    /// Input channels of the Detect head (outputs of layers 15, 18, 21 in YOLOv8; 16, 19, 22 in YOLO11).
    pub fn head_channels(&self) -> [usize; 3] {
        [self.ch(256), self.ch(512), self.ch(1024)]
    }

    /// Hidden channels of the box branch: `max(16, ch[0] / 4, 4 * reg_max)`.
    pub fn box_hidden(&self) -> usize {
        16.max(self.head_channels()[0] / 4).max(4 * self.family.reg_max())
    }

    /// Hidden channels of the class branch: `max(ch[0], min(nc, 100))`, or [`YoloConfig::cls_width`].
    pub fn cls_hidden(&self) -> usize {
        self.cls_width.unwrap_or_else(|| self.head_channels()[0].max(self.nc.min(100)))
    }

    /// Number of anchors for a square input of side `imgsz`.
    pub fn num_anchors(imgsz_h: usize, imgsz_w: usize) -> usize {
        STRIDES.iter().map(|s| (imgsz_h / s) * (imgsz_w / s)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yolov8n_channels_match_the_fixture_shapes() {
        let c = YoloConfig::new(Scale::N, 80);
        assert_eq!(c.head_channels(), [64, 128, 256]);
        assert_eq!(c.depth(3), 1);
        assert_eq!(c.depth(6), 2);
        assert_eq!(c.box_hidden(), 64);
        assert_eq!(c.cls_hidden(), 80);
    }

    #[test]
    fn other_scales_follow_the_yaml() {
        assert_eq!(YoloConfig::new(Scale::M, 80).ch(1024), 576);
        assert_eq!(YoloConfig::new(Scale::X, 80).ch(1024), 640);
        assert_eq!(YoloConfig::new(Scale::L, 80).ch(1024), 512);
        assert_eq!(YoloConfig::new(Scale::M, 80).depth(3), 2);
        assert_eq!(YoloConfig::new(Scale::X, 80).box_hidden(), 80);
        assert_eq!(Scale::parse("yolov8s").ok(), Some(Scale::S));
        assert!(Scale::parse("yolov9").is_err());
        assert_eq!(Scale::from_model("yolov8m.yaml").ok(), Some(Scale::M));
        assert_eq!(Scale::from_model("some/dir/yolov8l.yaml").ok(), Some(Scale::L));
    }

    #[test]
    fn custom_multipliers_from_a_model_yaml() {
        let s = Scale::from_model_yaml("# tiny\nnc: 5\ndepth_multiple: 0.33\nwidth_multiple: 0.125 # half of n\n")
            .expect("parse");
        assert_eq!(s.multipliers(), (0.33, 0.125, 1024));
        let c = YoloConfig::new(s, 5);
        assert_eq!(c.head_channels(), [32, 64, 128]);
        assert_eq!(c.depth(3), 1);
        assert_eq!(s.name(), "yolov8(d0.33,w0.125,c1024)");
        // Ultralytics' own scales written as multipliers give the same channel table.
        let n = Scale::from_model_yaml("depth_multiple: 0.33\nwidth_multiple: 0.25\nmax_channels: 1024").expect("n");
        for c in [64, 128, 256, 512, 1024] {
            assert_eq!(YoloConfig::new(n, 80).ch(c), YoloConfig::new(Scale::N, 80).ch(c));
        }
        let err = Scale::from_model_yaml("depth_multiple: 0.33\nwidth_multiple: x").expect_err("bad number");
        assert!(err.contains("width_multiple") && err.contains("line 2"), "{err}");
        assert!(Scale::from_model_yaml("depth_multiple: 0.33").expect_err("missing").contains("width_multiple"));
        assert!(
            Scale::from_model_yaml("depth_multiple: 1\nwidth_multiple: 1\nbackbone:\n  - [-1, 1, Conv, [64]]").is_err()
        );
        assert!(Scale::from_model_yaml("depth_multiple: 0\nwidth_multiple: 1").is_err());
    }

    #[test]
    fn yolo11_names_scales_and_yaml_family() {
        let c = YoloConfig::from_model("yolo11n.yaml", 80).expect("yolo11n");
        assert_eq!((c.family, c.scale), (Family::V11, Scale::N));
        assert_eq!(c.multipliers(), (0.5, 0.25, 1024));
        assert_eq!(c.depth(2), 1);
        assert_eq!(c.head_channels(), [64, 128, 256]);
        assert_eq!(c.name(), "yolo11n");
        let m = YoloConfig::from_model("some/dir/yolo11m", 80).expect("yolo11m");
        assert_eq!(m.multipliers(), (0.5, 1.0, 512));
        assert_eq!(m.ch(1024), 512);
        assert_eq!(YoloConfig::from_model("yolov8s", 3).expect("v8").family, Family::V8);
        assert!(parse_model("yolo11q").is_err());
        let (f, s) = parse_model_yaml("family: yolo11\ndepth_multiple: 0.5\nwidth_multiple: 0.125\n").expect("yaml");
        assert_eq!(f, Family::V11);
        assert_eq!(f.model_name(s), "yolo11(d0.5,w0.125,c1024)");
        assert!(parse_model_yaml("family: yolo12\ndepth_multiple: 0.5\nwidth_multiple: 0.125").is_err());
    }
}
