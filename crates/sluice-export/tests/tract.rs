//! The exported ONNX graphs run in a real runtime (tract, pure Rust) and give the model's eval forward
//! (`Yolo::forward`, what `sluice model run` writes): the tiny yolov8 of `configs/models/yolov8-tiny.yaml` with
//! non-trivial BatchNorm statistics, and yolov8n with the parity fixture's weights on its input
//! (`crates/sluice-model/tests/data`), batch 1 and 4, fixed and symbolic shapes, float32 and float16. The tiny
//! model agrees within 1e-4 relative to `max(1, |y|)`; yolov8n's scores within 1e-4 and its boxes within 0.02 px,
//! the spread of float32 implementations at its depth (see the test).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use prost::Message;
use sluice_export::{ExportArgs, Metadata, OnnxOptions, to_onnx_bytes};
use sluice_model::candle_core::{DType, Device, Tensor};
use sluice_model::{Family, LoadMode, Scale, Yolo, YoloConfig};
use tract_onnx::pb::ModelProto;
use tract_onnx::pb::tensor_shape_proto::dimension::Value as DimValue;
use tract_onnx::pb::type_proto::Value as TypeValue;
use tract_onnx::prelude::{
    Arc, Datum, DatumExt, Framework, InferenceModelExt, IntoRunnable, IntoTensor, TypedRunnableModel, tvec,
};

fn model_data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/data").join(name)
}

fn meta(model: &Yolo, opts: &OnnxOptions) -> Metadata {
    Metadata {
        description: "test".into(),
        author: "sluice".into(),
        date: sluice_export::metadata::utc_now_iso(),
        version: "0".into(),
        license: "none".into(),
        docs: "none".into(),
        stride: 32,
        task: "detect".into(),
        head: "Detect".into(),
        batch: opts.batch,
        imgsz: opts.imgsz,
        names: (0..model.config().nc).map(|i| format!("class{i}")).collect(),
        args: ExportArgs { batch: opts.batch, half: opts.half, nms: false, dynamic: opts.dynamic, opset: opts.opset },
        channels: 3,
        end2end: false,
    }
}

/// The tiny YOLOv8 (`configs/models/yolov8-tiny.yaml`, 5 classes), seeded, with every BatchNorm's statistics and
/// affine parameters moved away from the identity so that the folding is exercised.
fn tiny() -> Yolo {
    randomised_bn(YoloConfig::new(Scale::custom(0.33, 0.125, 1024).unwrap(), 5))
}

/// A seeded model of `cfg` with every BatchNorm moved away from the identity.
fn randomised_bn(cfg: YoloConfig) -> Yolo {
    let m = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 3).unwrap();
    let data = m.varmap().data().lock().unwrap().clone();
    for (i, (k, v)) in data.iter().enumerate() {
        let n = v.as_tensor().elem_count();
        // Uniform-looking values in [0, 1) from a fixed formula, so every run folds the same statistics.
        let u: Vec<f32> =
            (0..n).map(|j| (((j * 31 + i * 7) as f32 * 12.9898).sin() * 43758.547).fract().abs()).collect();
        let r = Tensor::from_vec(u, n, &Device::Cpu).unwrap();
        let new = if k.ends_with(".running_var") || k.ends_with(".bn.weight") {
            r.affine(0.8, 0.6).unwrap()
        } else if k.ends_with(".running_mean") || k.ends_with(".bn.bias") {
            r.affine(0.2 + 0.01 * (i % 3) as f64, -0.1).unwrap()
        } else {
            continue;
        };
        v.set(&new.reshape(v.shape()).unwrap()).unwrap();
    }
    m
}

/// The parity fixture's yolov8n: seed-0 weights (drawn as PyTorch draws them, which sluice-model's tests hold to
/// Ultralytics' bit for bit) with the BN-calibrated statistics.
fn yolov8n() -> Yolo {
    let mut m = Yolo::new_seeded(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu, 0).unwrap();
    m.load_weights(model_data("yolov8n_seed0_bncal_overlay.safetensors"), LoadMode::Overlay).unwrap();
    m
}

fn export(model: &Yolo, opts: &OnnxOptions) -> Vec<u8> {
    to_onnx_bytes(&model.graph().unwrap(), opts, &meta(model, opts)).unwrap()
}

type Plan = Arc<TypedRunnableModel>;

/// The ONNX bytes loaded by tract, optimised for this input shape (`None`: the shapes the file declares).
fn plan<T: Datum>(bytes: &[u8], shape: Option<&[usize]>) -> Plan {
    let mut m = tract_onnx::onnx().model_for_read(&mut &bytes[..]).unwrap();
    if let Some(s) = shape {
        m = m.with_input_fact(0, T::fact(s).into()).unwrap();
    }
    m.into_optimized().unwrap().into_runnable().unwrap()
}

fn run(plan: &Plan, x: &Tensor) -> Vec<f32> {
    let dims = x.dims().to_vec();
    let v = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let input = tract_onnx::prelude::Tensor::from_shape(&dims, &v).unwrap();
    let out = plan.run(tvec!(input.into_tensor().into())).unwrap();
    let out = out[0].cast_to::<f32>().unwrap();
    out.to_plain_array_view::<f32>().unwrap().iter().copied().collect()
}

fn run_f16(plan: &Plan, x: &Tensor) -> Vec<f32> {
    let dims = x.dims().to_vec();
    let v: Vec<half::f16> =
        x.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(half::f16::from_f32).collect();
    let input = tract_onnx::prelude::Tensor::from_shape(&dims, &v).unwrap();
    let out = plan.run(tvec!(input.into_tensor().into())).unwrap();
    let out = out[0].cast_to::<f32>().unwrap();
    out.to_plain_array_view::<f32>().unwrap().iter().copied().collect()
}

/// The largest absolute differences of the box rows (pixels) and of the score rows of `(B, 4 + nc, A)` outputs.
fn split_worst(got: &[f32], want: &Tensor) -> (f32, f32) {
    let (b, c, a) = want.dims3().unwrap();
    let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    let (mut boxes, mut scores) = (0f32, 0f32);
    for i in 0..b * c * a {
        let d = (got[i] - want[i]).abs();
        if (i / a) % c < 4 { boxes = boxes.max(d) } else { scores = scores.max(d) }
    }
    (boxes, scores)
}

/// The largest difference relative to `max(1, |expected|)` (boxes are in pixels, scores in [0, 1]).
fn worst(got: &[f32], want: &Tensor) -> f32 {
    let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    got.iter().zip(&want).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max)
}

fn input(b: usize, h: usize, w: usize, seed: u64) -> Tensor {
    let n = b * 3 * h * w;
    // A deterministic pattern in [0, 1]: the runtime and the model see the same numbers.
    let v: Vec<f32> = (0..n as u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 1000) as f32 / 999.0)
        .collect();
    Tensor::from_vec(v, (b, 3, h, w), &Device::Cpu).unwrap()
}

#[test]
fn tiny_fixed_shapes_match_the_eval_forward_at_batch_1_and_4() {
    let m = tiny();
    for (batch, (h, w)) in [(1, (64, 96)), (4, (96, 64))] {
        let opts = OnnxOptions { imgsz: (h, w), batch, ..Default::default() };
        let plan = plan::<f32>(&export(&m, &opts), None);
        let x = input(batch, h, w, batch as u64);
        let want = m.forward(&x).unwrap().y;
        let got = run(&plan, &x);
        let e = worst(&got, &want);
        assert!(e < 1e-4, "batch {batch} {h}x{w}: worst relative difference {e}");
    }
}

#[test]
fn tiny_dynamic_export_runs_any_batch_and_size() {
    let m = tiny();
    let opts = OnnxOptions { imgsz: (64, 64), dynamic: true, ..Default::default() };
    let bytes = export(&m, &opts);
    let proto = ModelProto::decode(&bytes[..]).unwrap();
    let g = proto.graph.as_ref().unwrap();
    let dims = |v: &tract_onnx::pb::ValueInfoProto| -> Vec<String> {
        let Some(TypeValue::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.clone()) else { panic!("type") };
        t.shape
            .unwrap()
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(DimValue::DimValue(v)) => v.to_string(),
                Some(DimValue::DimParam(p)) => p.clone(),
                None => "?".into(),
            })
            .collect()
    };
    assert_eq!(dims(&g.input[0]), ["batch", "3", "height", "width"]);
    assert_eq!(dims(&g.output[0]), ["batch", "9", "anchors"]);
    for (b, h, w) in [(1, 64, 64), (4, 96, 128), (2, 32, 160)] {
        let plan = plan::<f32>(&bytes, Some(&[b, 3, h, w]));
        let x = input(b, h, w, 7);
        let e = worst(&run(&plan, &x), &m.forward(&x).unwrap().y);
        assert!(e < 1e-4, "{b}x3x{h}x{w}: worst relative difference {e}");
    }
}

#[test]
fn yolov8n_matches_the_eval_forward_on_the_parity_input() {
    let m = yolov8n();
    let x = Tensor::read_npy(model_data("parity_in_seed1_320.npy")).unwrap();
    let want = m.forward(&x).unwrap().y;
    let plan1 = plan::<f32>(&export(&m, &OnnxOptions { imgsz: (320, 320), ..Default::default() }), None);
    let got = run(&plan1, &x);
    // Class scores agree within 1e-4. Box coordinates (pixels, up to 320) of yolov8n with its calibrated statistics
    // differ by about 0.01 px between any two float32 implementations (Sluice and PyTorch differ by 0.009 px on
    // this input, and tract by as much from either): 22 layers of convolutions summed in different orders.
    let (boxes, scores) = split_worst(&got, &want);
    assert!(scores < 1e-4 && boxes < 0.02, "batch 1: box rows {boxes} px, score rows {scores}");
    // And against Ultralytics' own output on the same input, within the parity fixture's tolerances.
    let (boxes, scores) = split_worst(&got, &Tensor::read_npy(model_data("parity_out_bncal_320.npy")).unwrap());
    assert!(scores < 1e-4 && boxes < 0.05, "against Ultralytics: box rows {boxes} px, score rows {scores}");
    // Batch 4 through the symbolic-shape export: the parity image, its mirror, a darker and a paler copy.
    let x4 = Tensor::cat(&[&x, &x.flip(&[3]).unwrap(), &x.affine(0.5, 0.0).unwrap(), &x.affine(0.8, 0.2).unwrap()], 0)
        .unwrap();
    let dynamic = export(&m, &OnnxOptions { imgsz: (320, 320), dynamic: true, batch: 4, ..Default::default() });
    let plan4 = plan::<f32>(&dynamic, Some(&[4, 3, 320, 320]));
    let (boxes, scores) = split_worst(&run(&plan4, &x4), &m.forward(&x4).unwrap().y);
    assert!(scores < 1e-4 && boxes < 0.02, "batch 4, dynamic: box rows {boxes} px, score rows {scores}");
}

#[test]
fn half_export_holds_float16_and_runs_close_to_the_float32_forward() {
    let m = tiny();
    let opts = OnnxOptions { imgsz: (64, 64), half: true, ..Default::default() };
    let bytes = export(&m, &opts);
    let proto = ModelProto::decode(&bytes[..]).unwrap();
    let g = proto.graph.as_ref().unwrap();
    let f16 = tract_onnx::pb::tensor_proto::DataType::Float16 as i32;
    assert!(g.initializer.iter().filter(|t| t.name.ends_with(".weight")).all(|t| t.data_type == f16));
    let plan = plan::<half::f16>(&bytes, None);
    let x = input(1, 64, 64, 5);
    let e = worst(&run_f16(&plan, &x), &m.forward(&x).unwrap().y);
    // float16 has an 11-bit significand: about 1e-3 relative per operation, a few of them compounding.
    assert!(e < 2e-2, "worst relative difference {e}");
}

#[test]
fn the_file_carries_ultralytics_names_opset_and_metadata() {
    let m = tiny();
    let opts = OnnxOptions { imgsz: (64, 64), batch: 2, opset: 19, ..Default::default() };
    let proto = ModelProto::decode(&export(&m, &opts)[..]).unwrap();
    assert_eq!((proto.ir_version, proto.opset_import[0].version), (9, 19));
    let g = proto.graph.as_ref().unwrap();
    assert_eq!((g.input[0].name.as_str(), g.output[0].name.as_str()), ("images", "output0"));
    let keys: Vec<&str> = proto.metadata_props.iter().map(|p| p.key.as_str()).collect();
    for k in
        ["description", "author", "date", "version", "license", "docs", "stride", "task", "batch", "imgsz", "names"]
    {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
    let get = |k: &str| proto.metadata_props.iter().find(|p| p.key == k).map(|p| p.value.clone()).unwrap();
    assert_eq!(get("imgsz"), "[64, 64]");
    assert_eq!(get("batch"), "2");
    assert!(get("names").starts_with("{0: 'class0', 1: 'class1'"), "{}", get("names"));
}

#[test]
fn bad_options_are_errors_naming_them() {
    let m = tiny();
    let g = m.graph().unwrap();
    let bad = |opts: OnnxOptions| to_onnx_bytes(&g, &opts, &meta(&m, &opts)).expect_err("bad options").to_string();
    assert!(bad(OnnxOptions { imgsz: (100, 64), ..Default::default() }).contains("multiples of 32"));
    assert!(bad(OnnxOptions { opset: 12, ..Default::default() }).contains("opset 12"));
    assert!(bad(OnnxOptions { batch: 0, ..Default::default() }).contains("batch"));
}

#[test]
fn yolo11_and_yolo26_match_the_eval_forward_fixed_and_dynamic() {
    // yolo11n (two attention heads in C2PSA, the depthwise class branches) and YOLO26 at the tiny width (the
    // residual SPPF without SiLU, a PSABlock inside C3k2, one box bin: no DFL in the decode).
    let y11 = randomised_bn(YoloConfig::new(Scale::N, 5).with_family(Family::V11));
    let y26 = randomised_bn(YoloConfig::new(Scale::custom(0.5, 0.125, 1024).unwrap(), 5).with_family(Family::V26));
    for (name, m) in [("yolo11n", &y11), ("yolo26t", &y26)] {
        let fixed = OnnxOptions { imgsz: (64, 96), batch: 2, ..Default::default() };
        let x = input(2, 64, 96, 11);
        let e = worst(&run(&plan::<f32>(&export(m, &fixed), None), &x), &m.forward(&x).unwrap().y);
        assert!(e < 1e-4, "{name} fixed: worst relative difference {e}");
        let bytes = export(m, &OnnxOptions { imgsz: (64, 64), dynamic: true, ..Default::default() });
        for (b, h, w) in [(1, 64, 64), (3, 96, 128)] {
            let x = input(b, h, w, 5);
            let e = worst(&run(&plan::<f32>(&bytes, Some(&[b, 3, h, w])), &x), &m.forward(&x).unwrap().y);
            assert!(e < 1e-4, "{name} {b}x3x{h}x{w}: worst relative difference {e}");
        }
    }
}
