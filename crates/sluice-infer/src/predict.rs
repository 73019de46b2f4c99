//! Prediction on image files, as Ultralytics' `yolo predict` does it: decode (EXIF-oriented RGB), letterbox to
//! `imgsz` with minimum stride padding (`LetterBox(auto=True, stride=32)`), the fused eval-mode forward on the
//! CPU, single-label NMS with Ultralytics' class-offset trick (`conf 0.25`, `iou 0.7`, `max_det 300`), and the
//! boxes mapped back to the original pixels and clipped to the image. Also: listing the sources (a file, a
//! folder, or a `.txt` list), the class count of a weights file, the run folder (`runs/predict`, `predict2`,
//! …), and COCO-format results through `sluice_dataset::coco`.

use std::path::{Path, PathBuf};

use sluice_augment::{Letterbox, LetterboxOpts, letterbox_into};
use sluice_core::{DecodeHint, Decoder, Detection, ImageLabels, ImageRgb8, SampleId};
use sluice_dataset::coco::{CocoDetection, export_detections};
use sluice_dataset::{ImageFormat, Sample, SampleIndex};
use sluice_decode::{Backend, Format};
use sluice_eval::masknms::nms_tensor;
use sluice_eval::{Layout, Nms, NmsMode, NmsParams, NmsScratch, PredView};
use sluice_model::candle_core::{DType, Device, Tensor};
use sluice_model::{Arch, ModelError, Yolo};

use crate::error::{InferError, Result};

/// The largest stride of a YOLOv8 model: canvases are multiples of it.
pub const MAX_STRIDE: u32 = 32;

/// The key whose shape `(nc,)` gives a YOLOv8 checkpoint's class count (the last class conv of the head).
pub const NC_KEY: &str = "model.22.cv3.0.2.bias";

/// The same tensor in a YOLO11 (whose Detect head is `model.23`).
pub const NC_KEY_V11: &str = "model.23.cv3.0.2.bias";

/// Prediction settings; [`Default`] is Ultralytics' `predict` defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictOptions {
    /// Letterbox size (the long side of the model input), rounded up to a multiple of 32.
    pub imgsz: u32,
    /// Detections need a score above this.
    pub conf: f32,
    /// NMS IoU threshold.
    pub iou: f32,
    /// Most detections per image.
    pub max_det: usize,
    /// Class-agnostic NMS.
    pub agnostic: bool,
    /// Predict with an end-to-end model's (YOLO26's) one-to-one head: its top-k rows with the conf threshold and
    /// no NMS (Ultralytics' `nms=False`); a model without that head runs NMS, as Ultralytics falls back.
    pub end2end: bool,
    /// Run NMS where the predictions are (the batched kernels on a GPU, only the kept rows copied; their host twin
    /// on the CPU) instead of on the host. Both keep the same detections; on a GPU it is an opt-in device path
    /// (`DevicePaths::device_nms`), off by default.
    pub device_nms: bool,
    /// Ultralytics' `half`: the fused model cast to float16 after folding (`Yolo::fuse_to`), its output back in
    /// f32 for the thresholds and NMS. Honoured on any device; `sluice predict` asks for it on CUDA devices only,
    /// as Ultralytics.
    pub half: bool,
}

impl Default for PredictOptions {
    fn default() -> Self {
        Self {
            imgsz: 640,
            conf: 0.25,
            iou: 0.7,
            max_det: 300,
            agnostic: false,
            end2end: false,
            device_nms: false,
            half: false,
        }
    }
}

/// The detections of one image file, in its original pixels.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// The image file.
    pub path: PathBuf,
    /// Its format (from the bytes).
    pub format: ImageFormat,
    /// Width after EXIF orientation.
    pub width: u32,
    /// Height after EXIF orientation.
    pub height: u32,
    /// Detections in descending score order, boxes in original pixels, clipped to the image.
    pub detections: Vec<Detection>,
    /// The letterbox the model saw.
    pub letterbox: Letterbox,
}

/// The class count of a YOLOv8 or YOLO11 safetensors checkpoint: the length of [`NC_KEY`] (or [`NC_KEY_V11`]), read
/// from the file's JSON header alone (the tensor data is not read).
pub fn weights_num_classes(path: &Path) -> Result<usize> {
    use std::io::Read;
    let io = |source| InferError::Io { path: path.to_path_buf(), source };
    let bad = |reason: String| InferError::Weights { path: path.to_path_buf(), reason };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|_| bad("shorter than a safetensors header".into()))?;
    let n = u64::from_le_bytes(len);
    let file_len = file.metadata().map_err(io)?.len();
    if n > 100 << 20 || n + 8 > file_len {
        return Err(bad(format!("header length {n} does not fit a {file_len}-byte file")));
    }
    let mut buf = vec![0u8; 8 + n as usize];
    buf[..8].copy_from_slice(&len);
    file.read_exact(&mut buf[8..]).map_err(io)?;
    // The header is a JSON object: tensor name -> {dtype, shape, data_offsets} (plus an optional `__metadata__`).
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&buf[8..]).map_err(|e| bad(format!("not a safetensors header: {e}")))?;
    // A training checkpoint keeps the weights to predict with under `ema.`.
    let info = [NC_KEY, NC_KEY_V11]
        .iter()
        .find_map(|k| header.get(*k).or_else(|| header.get(&format!("ema.{k}"))))
        .ok_or_else(|| {
            bad(format!("no tensor '{NC_KEY}' or '{NC_KEY_V11}' (not a YOLOv8 / YOLO11 detection model?)"))
        })?;
    let shape: Option<Vec<u64>> =
        info.get("shape").and_then(|s| s.as_array()).map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect());
    match shape.as_deref() {
        Some(&[nc]) if nc > 0 => Ok(nc as usize),
        _ => Err(bad(format!(
            "'{NC_KEY}' has shape {}, expected [nc]",
            info.get("shape").unwrap_or(&serde_json::Value::Null)
        ))),
    }
}

/// The images of `source`: the file itself when it has an image extension, else every image under the folder
/// (recursively) or listed in the `.txt` file, sorted by path.
pub fn list_sources(source: &Path) -> Result<Vec<PathBuf>> {
    let is_image = source
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| sluice_dataset::IMG_FORMATS.contains(&e.to_ascii_lowercase().as_str()));
    if source.is_file() && is_image {
        return Ok(vec![source.to_path_buf()]);
    }
    if !source.exists() {
        return Err(InferError::Invalid { what: "source", reason: format!("{} does not exist", source.display()) });
    }
    Ok(sluice_dataset::config::list_images(&[source.to_path_buf()], source)?)
}

/// `project/name`, or `project/name2`, `name3`, … when it exists (Ultralytics' `increment_path`); not created.
pub fn next_run_dir(project: &Path, name: &str) -> PathBuf {
    let first = project.join(name);
    if !first.exists() {
        return first;
    }
    (2u32..).map(|i| project.join(format!("{name}{i}"))).find(|p| !p.exists()).unwrap_or(first)
}

/// The detections as COCO results (`sluice_dataset::coco::export_detections`): `image_id` is the file stem when
/// it is a number, else the image's position in `preds`; `category_id` is `class + 1` (Ultralytics' mapping for
/// non-COCO datasets, and the one `export_ground_truth` writes), `bbox` is `[x, y, w, h]` in original pixels.
pub fn coco_results(preds: &[Prediction], names: &[String]) -> Vec<CocoDetection> {
    let index = SampleIndex {
        names: names.to_vec(),
        samples: preds
            .iter()
            .map(|p| Sample {
                image: p.path.clone(),
                format: p.format,
                label_file: None,
                labels: ImageLabels { width: p.width, height: p.height, objects: Vec::new() },
                crowd: Vec::new(),
                image_id: None,
            })
            .collect(),
        category_ids: None,
    };
    export_detections(&index, preds.iter().enumerate().map(|(i, p)| (i as SampleId, p.detections.as_slice())))
}

/// Decoded images each decode thread of [`Predictor::predict_stream`] keeps waiting for the model.
pub const DECODE_AHEAD: usize = 2;

/// A loaded model ready to predict on images.
pub struct Predictor {
    model: Yolo,
    nc: usize,
    opts: PredictOptions,
    nms: Nms,
    scratch: NmsScratch,
    /// Shared with the decode threads of [`Predictor::predict_stream`].
    decoder: std::sync::Arc<dyn Decoder>,
}

/// An image file read and decoded, ready for [`Predictor::predict_decoded`].
#[derive(Debug, Clone)]
pub struct DecodedFile {
    /// The file.
    pub path: PathBuf,
    /// Its format (from the bytes).
    pub format: ImageFormat,
    /// Its pixels, after EXIF orientation.
    pub image: ImageRgb8,
}

impl DecodedFile {
    /// The file's prediction from its detections and letterbox, and its image (for drawing).
    fn into_prediction(self, detections: Vec<Detection>, letterbox: Letterbox) -> (Prediction, ImageRgb8) {
        let pred = Prediction {
            width: self.image.width(),
            height: self.image.height(),
            path: self.path,
            format: self.format,
            detections,
            letterbox,
        };
        (pred, self.image)
    }
}

/// Reads and decodes one image file with `decoder`: no model work, so it runs on any thread.
pub fn decode_file(decoder: &dyn Decoder, path: &Path) -> Result<DecodedFile> {
    let bytes = std::fs::read(path).map_err(|source| InferError::Io { path: path.to_path_buf(), source })?;
    let format = match Format::sniff(&bytes) {
        Some(Format::Jpeg) => ImageFormat::Jpeg,
        Some(Format::Png) => ImageFormat::Png,
        Some(Format::Bmp) => ImageFormat::Bmp,
        Some(Format::WebP) => ImageFormat::Webp,
        other => {
            return Err(InferError::Decode {
                path: path.to_path_buf(),
                reason: format!("unsupported image format {other:?} (JPEG, PNG, BMP or WebP)"),
            });
        }
    };
    let mut image = ImageRgb8::default();
    decoder
        .decode(&bytes, DecodeHint::default(), &mut image)
        .map_err(|e| InferError::Decode { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(DecodedFile { path: path.to_path_buf(), format, image })
}

impl std::fmt::Debug for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictor").field("model", &self.model).field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl Predictor {
    /// Loads `weights` (Ultralytics key names) as a model of `arch` with `nc` classes (`None`: read from the
    /// file), or an Ultralytics `.pt` checkpoint with its own architecture and class count, folds BatchNorm into the convolutions, and picks the preferred decode backend.
    pub fn load(weights: &Path, arch: Arch, nc: Option<usize>, opts: PredictOptions) -> Result<Self> {
        Self::load_on(weights, arch, nc, opts, &Device::Cpu)
    }

    /// [`Predictor::load`] with the model on `device` (a CUDA device in a build with the `cuda` feature): images
    /// are letterboxed on the host, copied in, and the output (for an end-to-end model only its top-k rows) read
    /// back for the thresholds and NMS.
    pub fn load_on(
        weights: &Path,
        arch: Arch,
        nc: Option<usize>,
        opts: PredictOptions,
        device: &Device,
    ) -> Result<Self> {
        let pt = sluice_model::is_pt(weights);
        let nc = match nc {
            Some(n) => n,
            // An Ultralytics checkpoint says its class count (and its architecture, which wins over `arch`).
            None if pt => {
                sluice_model::read_pt(weights)
                    .map_err(|e| InferError::Weights { path: weights.to_path_buf(), reason: e.to_string() })?
                    .nc
            }
            None => weights_num_classes(weights)?,
        };
        let invalid = |reason: String| InferError::Invalid { what: "predict options", reason };
        if opts.imgsz == 0 {
            return Err(invalid("imgsz must be positive".into()));
        }
        if !(0.0..=1.0).contains(&opts.conf) || !(0.0..=1.0).contains(&opts.iou) || opts.max_det == 0 {
            return Err(invalid(format!(
                "conf {} and iou {} in [0, 1], max_det {} >= 1",
                opts.conf, opts.iou, opts.max_det
            )));
        }
        let opts = PredictOptions { imgsz: opts.imgsz.div_ceil(MAX_STRIDE) * MAX_STRIDE, ..opts };
        let context = weights.display().to_string();
        let model_err = |source| InferError::Model { context: context.clone(), source: Box::new(source) };
        // A training checkpoint (sluice train's last/best): its EMA weights, as Ultralytics predicts with.
        let stored = crate::weights::checkpoint_model(weights);
        let checkpoint = stored.is_some();
        // Its architecture is the one it trained (a yolo11 checkpoint predicts as yolo11 whatever `arch` says).
        let arch = stored.and_then(|m| m.ok()).and_then(|m| sluice_model::parse_model(&m).ok()).unwrap_or(arch);
        let model = if pt {
            Yolo::from_pt(weights, DType::F32, device).and_then(|(m, ckpt)| {
                if ckpt.nc != nc {
                    return Err(sluice_model::ModelError::Pt {
                        file: weights.to_path_buf(),
                        reason: format!("a model for {} classes, {nc} asked", ckpt.nc),
                    });
                }
                Ok(m)
            })
        } else if checkpoint {
            arch.config(nc).fit_to_weights(weights, "ema.").and_then(|c| Yolo::new(c, DType::F32, device)).and_then(
                |mut m| {
                    m.load_weights_prefixed(weights, "ema.", sluice_model::LoadMode::Strict)?;
                    Ok(m)
                },
            )
        } else {
            Yolo::load(arch.config(nc), weights, DType::F32, device)
        }
        .and_then(|m| m.fuse_to(if opts.half { DType::F16 } else { DType::F32 }))
        .map_err(model_err)?;
        let nms = Nms::new(NmsParams {
            conf_thres: f64::from(opts.conf),
            iou_thres: f64::from(opts.iou),
            max_det: opts.max_det,
            multi_label: false,
            agnostic: opts.agnostic,
            mode: if opts.end2end && model.config().family.end2end() {
                NmsMode::None
            } else {
                NmsMode::ClassOffset { max_wh: 7680.0 }
            },
            ..NmsParams::default()
        });
        let decoder = Backend::preferred_decoder().map_err(|e| invalid(format!("no image decoder: {e}")))?;
        Ok(Self { model, nc, opts, nms, scratch: NmsScratch::default(), decoder: decoder.into() })
    }

    /// The class count of the model.
    pub fn num_classes(&self) -> usize {
        self.nc
    }

    /// The settings in force (`imgsz` rounded up to a multiple of 32).
    pub fn options(&self) -> PredictOptions {
        self.opts
    }

    /// The letterbox of a `w x h` image: Ultralytics' predict `LetterBox(imgsz, auto=True, stride=32)`.
    pub fn letterbox_for(&self, w: u32, h: u32) -> Letterbox {
        let opts = LetterboxOpts { auto: true, stride: MAX_STRIDE, ..LetterboxOpts::default() };
        Letterbox::new(w, h, self.opts.imgsz, self.opts.imgsz, opts)
    }

    /// Detections of a decoded image (`name` only names it in errors), boxes in its pixels.
    pub fn predict_image(&mut self, image: &ImageRgb8, name: &Path) -> Result<(Vec<Detection>, Letterbox)> {
        let mut out = self.predict_images(&[(image, name)])?;
        out.pop().ok_or_else(|| InferError::Invalid { what: "predict batch", reason: "no output".into() })
    }

    /// Detections of a batch of decoded images in one forward (`name`s only name them in errors), boxes in each
    /// image's pixels. As Ultralytics' predictor: images of one size share the minimal stride-padded canvas
    /// ([`Predictor::letterbox_for`]), a batch of mixed sizes is letterboxed to the square `imgsz`.
    pub fn predict_images(&mut self, images: &[(&ImageRgb8, &Path)]) -> Result<Vec<(Vec<Detection>, Letterbox)>> {
        let Some(&(first, first_name)) = images.first() else { return Ok(Vec::new()) };
        for (image, name) in images {
            let (w, h) = (image.width(), image.height());
            if w == 0 || h == 0 {
                return Err(InferError::Decode { path: name.to_path_buf(), reason: format!("empty {w}x{h} image") });
            }
        }
        let same = images.iter().all(|(i, _)| (i.width(), i.height()) == (first.width(), first.height()));
        let opts = LetterboxOpts { auto: same, stride: MAX_STRIDE, ..LetterboxOpts::default() };
        let lbs: Vec<Letterbox> = images
            .iter()
            .map(|(i, _)| Letterbox::new(i.width(), i.height(), self.opts.imgsz, self.opts.imgsz, opts))
            .collect();
        let (cw, ch) = (lbs[0].canvas.0 as usize, lbs[0].canvas.1 as usize);
        let plane = 3 * cw * ch;
        let mut chw = vec![0u8; plane * images.len()];
        for ((image, _), (lb, dst)) in images.iter().zip(lbs.iter().zip(chw.chunks_exact_mut(plane))) {
            letterbox_into(image, lb, dst);
        }
        let x: Vec<f32> = chw.iter().map(|&v| f32::from(v) / 255.0).collect();
        let context = if images.len() == 1 {
            first_name.display().to_string()
        } else {
            format!("{} and {} more", first_name.display(), images.len() - 1)
        };
        let model_err = |source| InferError::Model { context: context.clone(), source: Box::new(source) };
        let candle = |e: sluice_model::candle_core::Error| model_err(ModelError::from(e));
        let model = &self.model;
        let input = Tensor::from_vec(x, (images.len(), 3, ch, cw), model.device())
            .and_then(|t| t.to_dtype(model.dtype()))
            .map_err(candle)?;
        let max_det = self.opts.max_det;
        let y = if self.nms.params.mode == NmsMode::None {
            // The one-to-one head's top-k rows in the eval output's layout; the pass below only thresholds them.
            sluice_kernels::threads::on_compute_pool(model.device(), || model.forward_end2end_decoded(&input, max_det))
                .map_err(model_err)?
        } else {
            sluice_kernels::threads::on_compute_pool(model.device(), || model.forward(&input)).map_err(model_err)?.y
        };
        let y = y.to_dtype(DType::F32).map_err(candle)?;
        let nms_err = |i: usize| {
            let path = images[i].1.to_path_buf();
            move |source| InferError::Nms { path, source }
        };
        let on_device = self.opts.device_nms;
        let (mut all, on_host) = if on_device {
            // Only the kept rows cross to the host, in one read; an image with a non-finite value goes to the host.
            let kept = nms_tensor(&y, Layout::ChannelsFirst, &self.nms.params).map_err(nms_err(0))?;
            let (dets, finite) = kept.read().map_err(nms_err(0))?;
            (dets, finite.into_iter().map(|ok| !ok).collect())
        } else {
            (vec![Vec::new(); images.len()], vec![true; images.len()])
        };
        let (anchors, mut data) = (y.dim(2).map_err(candle)?, None);
        for (i, dets) in all.iter_mut().enumerate().filter(|(i, _)| on_host[*i]) {
            // On the host NMS also names the anchor and row of a non-finite value.
            if data.is_none() {
                data = Some(y.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(candle)?);
            }
            let per = (4 + self.nc) * anchors;
            let d = data.as_deref().unwrap_or_default();
            let view = PredView::new(
                d.get(i * per..(i + 1) * per).unwrap_or_default(),
                self.nc,
                anchors,
                Layout::ChannelsFirst,
            )
            .map_err(nms_err(i))?;
            self.nms.run(&view, 0, &mut self.scratch, dets, None).map_err(nms_err(i))?;
        }
        Ok(all
            .into_iter()
            .zip(images.iter().zip(lbs))
            .map(|(mut dets, ((image, _), lb))| {
                for d in &mut dets {
                    // As Ultralytics' predictor maps boxes back (`scale_boxes`: each axis by its rounded gain).
                    let (w, h) = (image.width(), image.height());
                    d.bbox = lb.unmap_box_rounded(&d.bbox, w, h).clip(w as f32, h as f32);
                }
                (dets, lb)
            })
            .collect())
    }

    /// Reads, decodes and predicts one image file. Returns the prediction and the decoded image (for drawing).
    pub fn predict_file(&mut self, path: &Path) -> Result<(Prediction, ImageRgb8)> {
        let decoded = decode_file(&*self.decoder, path)?;
        self.predict_decoded(decoded)
    }

    /// Predicts a decoded file. Returns the prediction and the image (for drawing).
    pub fn predict_decoded(&mut self, d: DecodedFile) -> Result<(Prediction, ImageRgb8)> {
        let (detections, letterbox) = self.predict_image(&d.image, &d.path)?;
        Ok(d.into_prediction(detections, letterbox))
    }

    /// Predicts `paths` in order, `batch` images per forward (as [`Predictor::predict_images`]), reading and decoding
    /// ahead on `threads` threads (at least one) while this thread runs the model: each thread takes every
    /// `threads`-th file and keeps at most [`DECODE_AHEAD`] decoded images waiting, so memory stays bounded and the
    /// model never waits on a decode that could have run earlier. `each(i, result)` sees file `i`'s prediction (or
    /// its error: a file that does not decode leaves its batch one image short) in order; an error it returns stops
    /// the stream (the decode threads stop at their next hand-off) and is returned.
    pub fn predict_stream<E: From<InferError>>(
        &mut self,
        paths: &[PathBuf],
        threads: usize,
        batch: usize,
        mut each: impl FnMut(usize, Result<(Prediction, ImageRgb8)>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let k = threads.clamp(1, paths.len().max(1));
        let batch = batch.max(1);
        std::thread::scope(|scope| {
            let mut rxs = Vec::with_capacity(k);
            for w in 0..k {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Result<DecodedFile>>(DECODE_AHEAD);
                rxs.push(rx);
                let decoder = std::sync::Arc::clone(&self.decoder);
                scope.spawn(move || {
                    for path in paths.iter().skip(w).step_by(k) {
                        // The receiver is gone once the consumer stopped: so is the need to decode.
                        if tx.send(decode_file(&*decoder, path)).is_err() {
                            break;
                        }
                    }
                });
            }
            let mut window: Vec<Result<DecodedFile>> = Vec::with_capacity(batch);
            for start in (0..paths.len()).step_by(batch) {
                window.clear();
                for (i, path) in paths.iter().enumerate().skip(start).take(batch) {
                    window.push(rxs[i % k].recv().unwrap_or_else(|_| {
                        Err(InferError::Decode { path: path.clone(), reason: "the decode thread stopped".into() })
                    }));
                }
                let ok: Vec<(&ImageRgb8, &Path)> =
                    window.iter().filter_map(|r| r.as_ref().ok()).map(|d| (&d.image, d.path.as_path())).collect();
                // A batch that fails is run image by image, so that each image gets its own result or error.
                let outs: Vec<Result<(Vec<Detection>, Letterbox)>> = match self.predict_images(&ok) {
                    Ok(p) => p.into_iter().map(Ok).collect(),
                    Err(e) if ok.len() == 1 => vec![Err(e)],
                    Err(_) => ok
                        .iter()
                        .map(|one| {
                            self.predict_images(std::slice::from_ref(one)).and_then(|mut v| {
                                v.pop().ok_or_else(|| InferError::Invalid {
                                    what: "predict batch",
                                    reason: "no output".into(),
                                })
                            })
                        })
                        .collect(),
                };
                let mut preds = outs.into_iter();
                for (j, r) in window.drain(..).enumerate() {
                    let out = r.and_then(|d| {
                        let (detections, letterbox) = preds.next().ok_or_else(|| InferError::Invalid {
                            what: "predict batch",
                            reason: "fewer outputs than images".into(),
                        })??;
                        Ok(d.into_prediction(detections, letterbox))
                    });
                    each(start + j, out)?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::BoxXyxy;
    use sluice_model::{Scale, YoloConfig};

    use super::*;

    fn saved_model(dir: &Path, nc: usize) -> PathBuf {
        let path = dir.join(format!("n{nc}.safetensors"));
        Yolo::new(YoloConfig::new(Scale::N, nc), DType::F32, &Device::Cpu).and_then(|m| m.save(&path)).expect("save");
        path
    }

    #[test]
    fn class_count_comes_from_the_header_and_bad_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(weights_num_classes(&saved_model(dir.path(), 3)).expect("nc"), 3);
        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"not a safetensors file at all").expect("write");
        let e = weights_num_classes(&junk).expect_err("junk");
        assert!(e.to_string().contains("junk.safetensors"), "{e}");
        let e = weights_num_classes(&dir.path().join("missing.safetensors")).expect_err("missing");
        assert!(e.to_string().contains("missing.safetensors"), "{e}");
    }

    #[test]
    fn sources_and_run_dirs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("imgs/sub")).expect("mkdir");
        for f in ["imgs/b.jpg", "imgs/a.PNG", "imgs/sub/c.jpeg", "imgs/notes.txt"] {
            std::fs::write(d.join(f), b"x").expect("write");
        }
        let got = list_sources(&d.join("imgs")).expect("dir");
        assert_eq!(got, vec![d.join("imgs/a.PNG"), d.join("imgs/b.jpg"), d.join("imgs/sub/c.jpeg")]);
        assert_eq!(list_sources(&d.join("imgs/b.jpg")).expect("file"), vec![d.join("imgs/b.jpg")]);
        assert!(list_sources(&d.join("nope")).expect_err("missing").to_string().contains("nope"));
        assert_eq!(next_run_dir(d, "predict"), d.join("predict"));
        std::fs::create_dir(d.join("predict")).expect("mkdir");
        std::fs::create_dir(d.join("predict2")).expect("mkdir");
        assert_eq!(next_run_dir(d, "predict"), d.join("predict3"));
    }

    #[test]
    fn predict_letterbox_round_trips_boxes_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = Predictor::load(&saved_model(dir.path(), 2), Arch::v8(Scale::N), None, PredictOptions::default())
            .expect("load");
        // Ultralytics predict on a 640x426 image at 640: ratio 1, canvas 640x448 (auto), 11 px top padding.
        let lb = p.letterbox_for(640, 426);
        assert_eq!((lb.ratio, lb.pad, lb.canvas), ((1.0, 1.0), [0, 11, 0, 11], (640, 448)));
        // 1280x960 at 640: ratio 1/2, 640x480 -> padded to 640x480 (a multiple of 32 already).
        let lb = p.letterbox_for(1280, 960);
        assert_eq!((lb.new_unpad, lb.canvas), ((640, 480), (640, 480)));
        let b = BoxXyxy::new(10.5, 20.25, 300.0, 959.0);
        assert_eq!(lb.unmap_box(&lb.map_box(&b)), b);
        assert_eq!(p.num_classes(), 2);
    }

    #[test]
    fn nms_where_the_predictions_are_keeps_the_same_detections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = saved_model(dir.path(), 3);
        // A random-init model on a textured image has many low-score boxes; conf 0.001 keeps a few hundred.
        let data: Vec<u8> = (0..200 * 150 * 3usize).map(|i| ((i * 7 + i / 600 * 13) % 256) as u8).collect();
        let img = ImageRgb8::from_raw(200, 150, 600, data).expect("image");
        let mut got = Vec::new();
        for device_nms in [false, true] {
            let o = PredictOptions { imgsz: 160, conf: 0.001, device_nms, ..PredictOptions::default() };
            let mut p = Predictor::load(&w, Arch::v8(Scale::N), None, o).expect("load");
            got.push(p.predict_image(&img, Path::new("img.png")).expect("predict").0);
        }
        assert!(!got[0].is_empty());
        assert_eq!(got[0], got[1]);
    }

    /// `half` (the fused model in float16): the detections of the f32 model, each found again with the same class,
    /// nearly the same box and score.
    #[test]
    fn half_precision_finds_the_f32_detections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = saved_model(dir.path(), 3);
        let data: Vec<u8> = (0..200 * 150 * 3usize).map(|i| ((i * 7 + i / 600 * 13) % 256) as u8).collect();
        let img = ImageRgb8::from_raw(200, 150, 600, data).expect("image");
        let run = |half: bool| {
            let o = PredictOptions { imgsz: 160, conf: 0.001, half, ..PredictOptions::default() };
            let mut p = Predictor::load(&w, Arch::v8(Scale::N), None, o).expect("load");
            p.predict_image(&img, Path::new("img.png")).expect("predict").0
        };
        let (full, half) = (run(false), run(true));
        assert!(full.len() >= 20, "{} detections", full.len());
        assert_ne!(full, half, "the half pass must have run in f16");
        for d in full.iter().take(20) {
            let best = half
                .iter()
                .filter(|h| h.class == d.class)
                .max_by(|a, b| a.bbox.iou(&d.bbox).total_cmp(&b.bbox.iou(&d.bbox)))
                .expect("a detection of that class");
            assert!(best.bbox.iou(&d.bbox) > 0.98, "{d:?} vs {best:?}");
            assert!((best.score - d.score).abs() < 5e-3, "{d:?} vs {best:?}");
        }
    }

    #[test]
    fn the_stream_predicts_every_file_in_order_as_one_at_a_time_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let synth = sluice_dataset::synth::SynthConfig {
            out: dir.path().join("data"),
            train: 7,
            val: 1,
            imgsz: 96,
            ..Default::default()
        };
        sluice_dataset::synth::generate(&synth).expect("data");
        let mut files = list_sources(&dir.path().join("data")).expect("list");
        files.truncate(7);
        // A file that does not decode, in the middle: its error comes in its place.
        let bad = dir.path().join("data/zz_bad.jpg");
        std::fs::write(&bad, b"not a jpeg").expect("write");
        files.insert(3, bad.clone());
        let w = saved_model(dir.path(), 6);
        let o = PredictOptions { imgsz: 96, conf: 0.001, ..PredictOptions::default() };
        let mut one = Predictor::load(&w, Arch::v8(Scale::N), None, o).expect("load");
        let want: Vec<Option<Vec<Detection>>> =
            files.iter().map(|f| one.predict_file(f).ok().map(|(p, _)| p.detections)).collect();
        assert!(want.iter().flatten().any(|d| !d.is_empty()));
        // One at a time in a stream (any thread count): the same detections, bit for bit. In batches of 4 or 3 (one
        // forward for several images of one size, so the same canvas): the same within float reassociation.
        for (threads, batch) in [(1, 1), (3, 1), (16, 1), (2, 4), (3, 3)] {
            let mut got = Vec::new();
            let r: std::result::Result<(), InferError> = one.predict_stream(&files, threads, batch, |i, r| {
                got.push((i, r.ok().map(|(p, _)| p.detections)));
                Ok(())
            });
            r.expect("stream");
            let order: Vec<usize> = got.iter().map(|g| g.0).collect();
            assert_eq!(order, (0..files.len()).collect::<Vec<_>>());
            let got: Vec<Option<Vec<Detection>>> = got.into_iter().map(|g| g.1).collect();
            if batch == 1 {
                assert_eq!(got, want, "{threads} threads");
                continue;
            }
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.is_some(), w.is_some());
                let (Some(g), Some(w)) = (g, w) else { continue };
                assert_eq!(g.len(), w.len(), "batch {batch}");
                for (a, b) in g.iter().zip(w) {
                    assert_eq!(a.class, b.class);
                    assert!((a.score - b.score).abs() <= 1e-4, "{a:?} {b:?}");
                    assert!(
                        (a.bbox.x1 - b.bbox.x1).abs() <= 1e-2 && (a.bbox.y2 - b.bbox.y2).abs() <= 1e-2,
                        "{a:?} {b:?}"
                    );
                }
            }
        }
        // An error from the callback stops the stream and comes back.
        let mut seen = 0;
        let r = one.predict_stream(&files, 2, 1, |i, _| {
            seen += 1;
            if i == 1 { Err(InferError::Invalid { what: "test", reason: "stop".into() }) } else { Ok(()) }
        });
        assert!(r.is_err());
        assert_eq!(seen, 2);
    }

    #[test]
    fn a_batch_of_mixed_sizes_is_letterboxed_to_the_square_size_as_ultralytics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = saved_model(dir.path(), 2);
        let o = PredictOptions { imgsz: 160, ..PredictOptions::default() };
        let mut p = Predictor::load(&w, Arch::v8(Scale::N), None, o).expect("load");
        let img =
            |w: u32, h: u32| ImageRgb8::from_raw(w, h, 3 * w as usize, vec![90; (3 * w * h) as usize]).expect("img");
        let (a, b) = (img(200, 150), img(100, 120));
        let name = Path::new("x.png");
        let mixed = p.predict_images(&[(&a, name), (&b, name)]).expect("mixed");
        assert!(
            mixed.iter().all(|(_, lb)| lb.canvas == (160, 160)),
            "{:?}",
            mixed.iter().map(|m| m.1.canvas).collect::<Vec<_>>()
        );
        // One size: the minimal stride-padded canvas, as one image alone gets.
        let same = p.predict_images(&[(&a, name), (&a, name)]).expect("same");
        let alone = p.letterbox_for(200, 150).canvas;
        assert_eq!(alone, (160, 128));
        assert!(same.iter().all(|(_, lb)| lb.canvas == alone));
        assert!(p.predict_images(&[]).expect("empty").is_empty());
    }

    #[test]
    fn bad_options_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = saved_model(dir.path(), 1);
        let o = PredictOptions { conf: 1.5, ..PredictOptions::default() };
        assert!(Predictor::load(&w, Arch::v8(Scale::N), None, o).is_err());
        // A class count that does not match the file is a model error naming the file.
        let e = Predictor::load(&w, Arch::v8(Scale::N), Some(4), PredictOptions::default()).expect_err("nc mismatch");
        assert!(e.to_string().contains("n1.safetensors"), "{e}");
        let p =
            Predictor::load(&w, Arch::v8(Scale::N), None, PredictOptions { imgsz: 100, ..PredictOptions::default() })
                .expect("load");
        assert_eq!(p.options().imgsz, 128);
    }
}
