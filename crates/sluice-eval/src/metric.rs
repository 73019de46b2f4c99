//! The evaluators as `sluice-core` [`Metric`] stages: per-image `update` with detections (after NMS) and
//! ground truth in pixel xyxy, one `finalize`. Each post-process worker owns one and the parts are merged at the
//! end ([`MergeMetric`]); the report does not depend on the number of workers or the order of images.

use sluice_core::{Detection, ImageLabels, MergeMetric, Metric, SampleId};

use crate::coco::{CocoAccumulator, CocoEval, CocoParams, DtBox, GtBox};
use crate::error::{Error, Result};
use crate::ultralytics::{ApAccumulator, ApReport, DetObj, GtObj};

fn image_key(id: SampleId) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::Invalid { what: "sample id", reason: format!("{id} does not fit i64") })
}

fn check_classes(id: SampleId, num_classes: u32, dets: &[Detection], truth: &ImageLabels) -> Result<()> {
    let bad = dets.iter().map(|d| d.class).chain(truth.objects.iter().map(|l| l.class)).find(|&c| c >= num_classes);
    match bad {
        Some(c) => Err(Error::Invalid { what: "class", reason: format!("sample {id}: class {c} >= {num_classes}") }),
        None => Ok(()),
    }
}

/// COCO bbox mAP (pycocotools semantics) over classes `0..num_classes`; GT area = box area, no crowd.
#[derive(Debug, Clone)]
pub struct CocoMetric {
    acc: CocoAccumulator,
    num_classes: u32,
    gts: Vec<GtBox>,
    dts: Vec<DtBox>,
}

impl CocoMetric {
    /// An evaluator for `num_classes` classes with COCO's default parameters.
    pub fn new(num_classes: u32) -> Result<Self> {
        let cats: Vec<i64> = (0..i64::from(num_classes)).collect();
        Ok(Self { acc: CocoAccumulator::new(CocoParams::default(), &cats)?, num_classes, gts: vec![], dts: vec![] })
    }
}

impl MergeMetric for CocoMetric {
    fn merge(&mut self, other: CocoMetric) -> sluice_core::Result<()> {
        Ok(self.acc.merge(other.acc)?)
    }
}

impl Metric for CocoMetric {
    type Report = CocoEval;

    fn update(&mut self, id: SampleId, detections: &[Detection], truth: &ImageLabels) -> sluice_core::Result<()> {
        check_classes(id, self.num_classes, detections, truth)?;
        self.gts.clear();
        self.dts.clear();
        for (i, l) in truth.objects.iter().enumerate() {
            let b = &l.bbox;
            let (x, y) = (f64::from(b.x1), f64::from(b.y1));
            let (w, h) = (f64::from(b.x2) - x, f64::from(b.y2) - y);
            // Ids only need to be non-zero (pycocotools reads id 0 as "no match").
            self.gts.push(GtBox {
                id: i as i64 + 1,
                category_id: i64::from(l.class),
                bbox: [x, y, w, h],
                area: w * h,
                iscrowd: false,
            });
        }
        for d in detections {
            let b = &d.bbox;
            let (x, y) = (f64::from(b.x1), f64::from(b.y1));
            self.dts.push(DtBox {
                category_id: i64::from(d.class),
                bbox: [x, y, f64::from(b.x2) - x, f64::from(b.y2) - y],
                score: f64::from(d.score),
            });
        }
        if self.gts.iter().any(|g| !g.bbox.iter().all(|v| v.is_finite()))
            || self.dts.iter().any(|d| !(d.score.is_finite() && d.bbox.iter().all(|v| v.is_finite())))
        {
            return Err(
                Error::Invalid { what: "boxes", reason: format!("sample {id}: non-finite box or score") }.into()
            );
        }
        Ok(self.acc.add_image(image_key(id)?, &self.gts, &self.dts)?)
    }

    fn finalize(&mut self) -> sluice_core::Result<CocoEval> {
        Ok(self.acc.finalize())
    }
}

/// Ultralytics `DetMetrics` (P, R, mAP50, mAP50-95, per class, PR curves) over classes `0..num_classes`.
#[derive(Debug, Clone)]
pub struct UltralyticsMetric {
    acc: ApAccumulator,
    num_classes: u32,
    gts: Vec<GtObj>,
    dets: Vec<DetObj>,
}

impl UltralyticsMetric {
    /// An evaluator for `num_classes` classes with the 10 default IoU thresholds.
    pub fn new(num_classes: u32) -> Self {
        Self { acc: ApAccumulator::default(), num_classes, gts: Vec::new(), dets: Vec::new() }
    }
}

impl UltralyticsMetric {
    /// The images added so far as bytes (JSON, floats round-trip exactly), for another process to merge.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(&(self.num_classes, &self.acc))
            .map_err(|e| Error::Invalid { what: "metric state", reason: e.to_string() })
    }

    /// A metric holding the images that [`UltralyticsMetric::to_bytes`] wrote; `what` names the source in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Self> {
        let (num_classes, acc): (u32, ApAccumulator) = serde_json::from_slice(bytes)
            .map_err(|e| Error::Invalid { what: "metric state", reason: format!("{what}: {e}") })?;
        Ok(Self { acc, num_classes, gts: Vec::new(), dets: Vec::new() })
    }
}

impl MergeMetric for UltralyticsMetric {
    fn merge(&mut self, other: UltralyticsMetric) -> sluice_core::Result<()> {
        Ok(self.acc.merge(other.acc)?)
    }
}

impl Metric for UltralyticsMetric {
    type Report = ApReport;

    fn update(&mut self, id: SampleId, detections: &[Detection], truth: &ImageLabels) -> sluice_core::Result<()> {
        check_classes(id, self.num_classes, detections, truth)?;
        let xyxy = |b: &sluice_core::BoxXyxy| [b.x1, b.y1, b.x2, b.y2];
        self.gts.clear();
        self.gts.extend(truth.objects.iter().map(|l| (l.class, xyxy(&l.bbox))));
        self.dets.clear();
        self.dets.extend(detections.iter().map(|d| (d.class, xyxy(&d.bbox), f64::from(d.score))));
        self.acc.add_image(image_key(id)?, &self.gts, &self.dets)?;
        Ok(())
    }

    fn finalize(&mut self) -> sluice_core::Result<ApReport> {
        Ok(self.acc.finalize())
    }
}
