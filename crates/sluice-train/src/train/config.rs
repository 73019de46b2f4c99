//! The training configuration: Ultralytics' argument names and defaults, read from a YAML file (`configs/*.yaml`,
//! or an Ultralytics `args.yaml`), then overridden by command-line flags. The resolved configuration is written next
//! to the run (`args.yaml`) and into every checkpoint, so `--resume` restores exactly what ran.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use serde::{Deserialize, Serialize};
use sluice_augment::Hyp;
use sluice_model::{Arch, LossGains};

use crate::optim::OptimSettings;
use sluice_infer::DevicePaths;
pub use sluice_loader::{CacheMode, ParseCacheModeError, ReadFrom};

/// Ultralytics' `amp` setting: `true` / `fp16` (float16 with dynamic loss scaling), `bf16` (bfloat16, no
/// scaling), `false` / `fp32` (off). On CUDA devices only: the CPU trains in f32, as Ultralytics' `check_amp` turns
/// float16 off there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Amp {
    /// Full float32.
    #[default]
    Off,
    /// `amp: true`: float16 with loss scaling on CUDA, as `fp16`.
    On,
    /// `amp: fp16`.
    Fp16,
    /// `amp: bf16`.
    Bf16,
}

impl Amp {
    /// Whether mixed precision was asked for.
    pub fn is_on(self) -> bool {
        self != Amp::Off
    }
}

impl std::str::FromStr for Amp {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "true" | "on" | "1" => Ok(Amp::On),
            "false" | "off" | "0" | "fp32" => Ok(Amp::Off),
            "fp16" | "f16" | "half" => Ok(Amp::Fp16),
            "bf16" => Ok(Amp::Bf16),
            other => Err(format!("amp '{other}': expected true, false, fp16, bf16 or fp32")),
        }
    }
}

impl std::fmt::Display for Amp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Amp::Off => "false",
            Amp::On => "true",
            Amp::Fp16 => "fp16",
            Amp::Bf16 => "bf16",
        })
    }
}

impl Serialize for Amp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Amp::Off => s.serialize_bool(false),
            Amp::On => s.serialize_bool(true),
            other => s.serialize_str(&other.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Amp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(b) => Ok(if b { Amp::On } else { Amp::Off }),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Everything a training run needs. Missing keys take Ultralytics' defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// Dataset YAML (Ultralytics `data.yaml`).
    pub data: PathBuf,
    /// Model: `yolov8n` … `yolov8x` (a `.yaml` suffix is accepted).
    pub model: String,
    /// Initial weights to fine-tune from (`.pt`, safetensors with Ultralytics' key names, or a Sluice training
    /// checkpoint, whose EMA is taken); every tensor whose name and shape fit is copied, as Ultralytics'
    /// `intersect_dicts`, so weights for another class count start the head's class branch fresh; none = from scratch.
    pub weights: Option<PathBuf>,
    /// Epochs.
    pub epochs: u32,
    /// Training size (square), a multiple of 32.
    pub imgsz: u32,
    /// Multi-scale training (Ultralytics 8.4's `multi_scale`): the range as a fraction of `imgsz`, 0 = off. Each
    /// batch gets its own side, drawn from `max(32, int(imgsz (1 - f))) .. int(imgsz (1 + f) + 32)` and rounded down
    /// to a multiple of 32 (0.5 at 640: 320 … 960). A boolean is accepted as Ultralytics reads it: `true` is 1.0
    /// (8.4 compares the value as a number; 8.3 and earlier meant ±50% by `True`, write 0.5 for that).
    #[serde(deserialize_with = "bool_or_fraction")]
    pub multi_scale: f64,
    /// Images per batch; `-1` in YAML or on the command line is Ultralytics' AutoBatch ([`AUTO_BATCH`] here until
    /// the trainer resolves it for the device).
    #[serde(deserialize_with = "batch_or_auto", serialize_with = "batch_out")]
    pub batch: usize,
    /// Loader workers per stage (0 = about 80% of the cores).
    pub workers: usize,
    /// Decoded-image cache: `none`, `ram` (in memory) or `disk` (one memory-mapped file per split and image size,
    /// beside the split's label cache or in `cache_dir`, reused by later runs while the images are unchanged).
    pub cache: CacheMode,
    /// The folder of the decoded-image cache files: `cache: disk`'s, instead of beside each split's label cache
    /// (e.g. a fast local disk, or when the dataset's folder is read-only), and the node cache of `cache: ram` in a
    /// data-parallel run, instead of `/dev/shm`.
    pub cache_dir: Option<PathBuf>,
    /// The object-store client's settings (`object_store`'s keys: `aws_access_key_id`, `aws_endpoint`, ...) for a
    /// dataset whose splits are URLs; the `sluice` binary fills them from the environment. Never written to a
    /// run's files, since they may hold credentials.
    #[serde(skip)]
    pub store_settings: Vec<(String, String)>,
    /// Where the images' bytes are read from: `files` (the image files, or the shard a split of the data YAML
    /// names) or `packed` (each split packed into a shard beside its label cache first, then read from it).
    pub source: ReadFrom,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Run seed (sampling, augmentation, initialisation).
    pub seed: u64,
    /// Runs folder.
    pub project: PathBuf,
    /// Run name (a suffix is added when the folder exists, unless `exist_ok`).
    pub name: String,
    /// Reuse the run folder if it exists.
    pub exist_ok: bool,
    /// Validate every N epochs (and always after the last one).
    pub val_interval: u32,
    /// Validate on this fraction of the val split (a fixed, seed-determined subset), 0 < f ≤ 1.
    pub val_fraction: f64,
    /// Stop on the first bad sample instead of skipping and counting it.
    pub strict: bool,
    /// Ultralytics' `deterministic` (its default, true): on a GPU, cuDNN takes only algorithms it marks
    /// deterministic (PyTorch's `cudnn.deterministic`). The CPU kernels are deterministic either way.
    pub deterministic: bool,
    /// Stop after this many consecutive non-finite losses (the last good checkpoint stays intact).
    pub max_nonfinite: u32,
    /// Write plots (results.png, PR curve, batch previews).
    pub plots: bool,
    /// Ultralytics' `nms`: `false` validates an end-to-end model (YOLO26) on its one-to-one head's top-k output
    /// without NMS; absent (the default) or `true`, validation runs NMS on the one-to-many output, as Ultralytics'
    /// default does.
    pub nms: Option<bool>,
    /// Mixed precision ([`Amp`]): float16 activations with dynamic loss scaling, or bfloat16, forward and
    /// backward, with f32 master weights, BatchNorm statistics and loss ([`sluice_model::Yolo::set_autocast`]).
    /// Off by default (Ultralytics' default is on) until a GPU run shows the half-precision step faster than f32.
    pub amp: Amp,
    /// The device paths beyond the ones a device run has verified, each off by default ([`DevicePaths`]: the keys
    /// `fused_step`, `cudnn_search`, `device_nms`, `gpu_timer`, `fused_ciou`, `fused_bce`, `fused_pool`).
    #[serde(flatten)]
    pub device_paths: DevicePaths,
    /// The device's loss path (the task-aligned assigner and the loss as tensor ops on the padded targets table,
    /// [`sluice_infer::loss_path`]) on the CPU too; a device always takes it. The two agree to float rounding, so this is
    /// how the device path runs end to end on a machine without a GPU.
    pub dense_loss: bool,
    /// Optimizer and schedule.
    #[serde(flatten)]
    pub optim: OptimSettings,
    /// Loss gains (`box`, `cls`, `dfl`).
    #[serde(flatten)]
    pub gains: Gains,
    /// Augmentation.
    #[serde(flatten)]
    pub hyp: Hyp,
}

/// Loss gains under Ultralytics' keys.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gains {
    /// Box (CIoU) gain, 7.5.
    #[serde(rename = "box")]
    pub box_gain: f64,
    /// Classification gain, 0.5.
    pub cls: f64,
    /// DFL gain, 1.5.
    pub dfl: f64,
}

impl Default for Gains {
    fn default() -> Self {
        let g = LossGains::default();
        Self { box_gain: g.box_gain, cls: g.cls, dfl: g.dfl }
    }
}

/// `batch` as read from `-1` (AutoBatch): the trainer picks the size for its device.
pub const AUTO_BATCH: usize = 0;

/// A batch size of at least 1, or `-1` for AutoBatch ([`AUTO_BATCH`]).
pub fn batch_from(v: i64) -> std::result::Result<usize, String> {
    match v {
        -1 => Ok(AUTO_BATCH),
        n if n >= 1 => usize::try_from(n).map_err(|e| format!("batch {n}: {e}")),
        n => Err(format!("batch {n}: expected a size of at least 1, or -1 for AutoBatch")),
    }
}

/// A `--batch` value: a size, or `-1` for AutoBatch.
pub fn parse_batch(s: &str) -> std::result::Result<usize, String> {
    batch_from(s.trim().parse::<i64>().map_err(|e| format!("'{s}': {e}"))?)
}

fn batch_or_auto<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<usize, D::Error> {
    batch_from(i64::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn batch_out<S: serde::Serializer>(v: &usize, s: S) -> std::result::Result<S::Ok, S::Error> {
    if *v == AUTO_BATCH { s.serialize_i64(-1) } else { s.serialize_u64(*v as u64) }
}

/// A number, or a boolean read as Python does (`True` = 1, `False` = 0): Ultralytics' fraction keys accept both.
fn bool_or_fraction<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a fraction of imgsz in [0, 1], or a boolean")]
    enum BoolOrNumber {
        Bool(bool),
        Number(f64),
    }
    Ok(match BoolOrNumber::deserialize(d)? {
        BoolOrNumber::Bool(b) => f64::from(u8::from(b)),
        BoolOrNumber::Number(v) => v,
    })
}

/// A `--multi-scale` value: a fraction in `[0, 1]`, or `true` / `false` (1 / 0, as Ultralytics 8.4 reads them).
pub fn parse_multi_scale(s: &str) -> std::result::Result<f64, String> {
    let v = match s.to_ascii_lowercase().as_str() {
        "true" => 1.0,
        "false" => 0.0,
        other => {
            other.parse::<f64>().map_err(|e| format!("'{s}': {e} (expected a fraction in [0, 1], true or false)"))?
        }
    };
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is outside [0, 1] (a fraction of imgsz)"));
    }
    Ok(v)
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            data: PathBuf::from("datasets/synthetic/data.yaml"),
            model: "yolov8n".into(),
            weights: None,
            epochs: 100,
            imgsz: 640,
            multi_scale: 0.0,
            batch: 16,
            workers: 0,
            cache: CacheMode::None,
            cache_dir: None,
            store_settings: Vec::new(),
            source: ReadFrom::Files,
            device: "cpu".into(),
            seed: 0,
            project: PathBuf::from("runs"),
            name: "exp".into(),
            exist_ok: false,
            val_interval: 1,
            val_fraction: 1.0,
            strict: false,
            deterministic: true,
            amp: Amp::Off,
            device_paths: DevicePaths::default(),
            dense_loss: false,
            max_nonfinite: 10,
            plots: true,
            nms: None,
            optim: OptimSettings::default(),
            gains: Gains::default(),
            hyp: Hyp::default(),
        }
    }
}

impl TrainConfig {
    /// Reads a YAML file; unknown keys are an error naming the file (a typo must not be silently ignored).
    pub fn from_yaml(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_yaml_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses YAML text.
    pub fn from_yaml_str(text: &str) -> Result<Self> {
        // `deny_unknown_fields` does not combine with `flatten`, so unknown keys are found by a round trip.
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)?;
        let cfg: Self = serde_yaml_ng::from_value(value.clone())?;
        let known = serde_yaml_ng::to_value(&cfg)?;
        if let (Some(given), Some(known)) = (value.as_mapping(), known.as_mapping()) {
            let unknown: Vec<String> = given
                .keys()
                .filter(|k| !known.contains_key(*k))
                .map(|k| serde_yaml_ng::to_string(k).unwrap_or_default().trim().to_string())
                .collect();
            if !unknown.is_empty() {
                crate::bail!("unknown key(s): {}", unknown.join(", "));
            }
        }
        Ok(cfg)
    }

    /// The YAML text of this configuration (written as `args.yaml`).
    pub fn to_yaml(&self) -> Result<String> {
        Ok(serde_yaml_ng::to_string(self)?)
    }

    /// The model family and scale named by `model`.
    pub fn arch(&self) -> Result<Arch> {
        sluice_model::parse_model(&self.model).with_context(|| {
            format!(
                "model '{}': expected yolov8n|s|m|l|x[.yaml], yolo11n|s|m|l|x[.yaml] or a model YAML with multipliers",
                self.model
            )
        })
    }

    /// Checks every value; errors name the key.
    pub fn validate(&self) -> Result<()> {
        self.arch()?;
        if self.epochs == 0 {
            crate::bail!("epochs must be at least 1");
        }
        if self.imgsz < 32 || !self.imgsz.is_multiple_of(32) {
            crate::bail!("imgsz {} must be a positive multiple of 32", self.imgsz);
        }
        if !(0.0..=1.0).contains(&self.multi_scale) {
            crate::bail!("multi_scale {} must be in [0, 1] (a fraction of imgsz; 0 = off)", self.multi_scale);
        }
        if self.val_interval == 0 {
            crate::bail!("val_interval must be at least 1");
        }
        if !(self.val_fraction > 0.0 && self.val_fraction <= 1.0) {
            crate::bail!("val_fraction {} must be in (0, 1]", self.val_fraction);
        }
        if self.device.contains(',') {
            sluice_infer::device_list(&self.device)?;
        } else if self.device != "cpu" && !self.device.starts_with("cuda") {
            crate::bail!("device '{}': expected cpu, cuda:N or a list of GPUs (0,1,2,3)", self.device);
        }
        self.hyp.validate().context("augmentation settings")?;
        Ok(())
    }

    /// Loss gains for the model crate.
    pub fn loss_gains(&self) -> LossGains {
        LossGains { box_gain: self.gains.box_gain, cls: self.gains.cls, dfl: self.gains.dfl }
    }

    /// `opts` with this run's validation device paths (`device_nms`, `gpu_timer`) and its `dense_loss`.
    pub fn val_options(&self, opts: sluice_infer::ValOptions) -> sluice_infer::ValOptions {
        opts.with_paths(&self.device_paths, self.dense_loss)
    }

    /// Whether `epoch` (0-based) is validated.
    pub fn validates(&self, epoch: u32) -> bool {
        epoch + 1 == self.epochs || (epoch + 1).is_multiple_of(self.val_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_modes_parse_and_size_the_cache() {
        assert_eq!("ram".parse::<CacheMode>(), Ok(CacheMode::Ram));
        assert_eq!("true".parse::<CacheMode>(), Ok(CacheMode::Ram));
        assert_eq!("none".parse::<CacheMode>(), Ok(CacheMode::None));
        assert_eq!("disk".parse::<CacheMode>(), Ok(CacheMode::Disk));
        assert!("ssd".parse::<CacheMode>().is_err_and(|e| e.to_string().contains("expected ram, disk or none")));
        let c = TrainConfig::from_yaml_str("cache: disk\ncache_dir: /fast/cache\n").unwrap();
        assert_eq!((c.cache, c.cache_dir.as_deref()), (CacheMode::Disk, Some(std::path::Path::new("/fast/cache"))));
        assert_eq!(CacheMode::None.budget_bytes(), 0);
        assert!(CacheMode::Ram.budget_bytes() > 0);
        assert_eq!(CacheMode::Ram.to_string(), "ram");
    }

    #[test]
    fn amp_reads_ultralytics_values_and_round_trips() {
        for (yaml, want) in [
            ("amp: true\n", Amp::On),
            ("amp: false\n", Amp::Off),
            ("amp: fp16\n", Amp::Fp16),
            ("amp: bf16\n", Amp::Bf16),
            ("amp: fp32\n", Amp::Off),
        ] {
            let c = TrainConfig::from_yaml_str(yaml).unwrap();
            assert_eq!(c.amp, want, "{yaml}");
            assert_eq!(TrainConfig::from_yaml_str(&c.to_yaml().unwrap()).unwrap().amp, want);
        }
        // Ultralytics' args.yaml keeps a boolean for on and off.
        assert!(TrainConfig { amp: Amp::On, ..Default::default() }.to_yaml().unwrap().contains("amp: true\n"));
        let e = TrainConfig::from_yaml_str("amp: fp8\n").unwrap_err();
        assert!(format!("{e:#}").contains("expected true, false, fp16, bf16 or fp32"), "{e:#}");
    }

    #[test]
    fn defaults_are_ultralytics() {
        let c = TrainConfig::default();
        assert_eq!((c.epochs, c.imgsz, c.batch), (100, 640, 16));
        assert_eq!((c.gains.box_gain, c.gains.cls, c.gains.dfl), (7.5, 0.5, 1.5));
        assert_eq!(c.hyp, Hyp::default());
        c.validate().unwrap();
    }

    #[test]
    fn yaml_overrides_and_keeps_defaults() {
        let c = TrainConfig::from_yaml_str("epochs: 3\nimgsz: 320\nmosaic: 0.5\ncls: 1.0\nlr0: 0.02\n").unwrap();
        assert_eq!((c.epochs, c.imgsz, c.batch), (3, 320, 16));
        assert_eq!(c.hyp.mosaic, 0.5);
        assert_eq!(c.gains.cls, 1.0);
        assert_eq!(c.optim.lr0, 0.02);
        let back = TrainConfig::from_yaml_str(&c.to_yaml().unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn batch_minus_one_is_autobatch_and_round_trips() {
        let c = TrainConfig::from_yaml_str("batch: -1\n").unwrap();
        assert_eq!(c.batch, AUTO_BATCH);
        assert!(c.to_yaml().unwrap().contains("batch: -1"));
        assert_eq!(TrainConfig::from_yaml_str(&c.to_yaml().unwrap()).unwrap().batch, AUTO_BATCH);
        let e = TrainConfig::from_yaml_str("batch: 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("-1 for AutoBatch"), "{e:#}");
        assert_eq!(parse_batch("32"), Ok(32));
        assert_eq!(parse_batch("-1"), Ok(AUTO_BATCH));
        assert!(parse_batch("-2").is_err());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = TrainConfig::from_yaml_str("epochz: 3\n").unwrap_err();
        assert!(format!("{e:#}").contains("epochz"), "{e:#}");
        let c = TrainConfig { imgsz: 100, ..Default::default() };
        assert!(c.validate().unwrap_err().to_string().contains("imgsz"));
        let c = TrainConfig { model: "yolov9t".into(), ..Default::default() };
        assert!(format!("{:#}", c.validate().unwrap_err()).contains("yolov9t"));
    }

    #[test]
    fn multi_scale_reads_fractions_and_booleans_like_ultralytics() {
        assert_eq!(TrainConfig::default().multi_scale, 0.0, "off by default");
        for (yaml, want) in [
            ("multi_scale: 0.5\n", 0.5),
            ("multi_scale: 1\n", 1.0),
            ("multi_scale: True\n", 1.0),
            ("multi_scale: false\n", 0.0),
        ] {
            let c = TrainConfig::from_yaml_str(yaml).unwrap();
            assert_eq!(c.multi_scale, want, "{yaml}");
            c.validate().unwrap();
            assert_eq!(TrainConfig::from_yaml_str(&c.to_yaml().unwrap()).unwrap(), c);
        }
        let e = TrainConfig::from_yaml_str("multi_scale: big\n").unwrap_err();
        assert!(format!("{e:#}").contains("fraction of imgsz"), "{e:#}");
        let c = TrainConfig::from_yaml_str("multi_scale: 1.5\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("multi_scale"));
        assert_eq!(parse_multi_scale("0.25"), Ok(0.25));
        assert_eq!(parse_multi_scale("True"), Ok(1.0));
        assert!(parse_multi_scale("-0.1").is_err() && parse_multi_scale("big").is_err());
    }

    #[test]
    fn validation_schedule() {
        let c = TrainConfig { epochs: 5, val_interval: 2, ..Default::default() };
        let v: Vec<u32> = (0..5).filter(|&e| c.validates(e)).collect();
        assert_eq!(v, vec![1, 3, 4]);
    }
}
