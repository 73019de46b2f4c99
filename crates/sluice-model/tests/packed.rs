//! [`Yolo::try_clone_packed`]: a copy whose floating-point variables are parts of one buffer. It must compute what
//! the model computes, every part must follow the buffer when the buffer takes new values in one op (the EMA's
//! update), and a write to one part must land in the buffer and nowhere else.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

use candle_core::{DType, Device, Tensor};
use sluice_model::{Family, Mode, Scale, Yolo, YoloConfig};

fn batch() -> Tensor {
    let n = 3 * 64 * 64;
    let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.618_034).fract()).collect();
    Tensor::from_vec(v, (1, 3, 64, 64), &Device::Cpu).unwrap()
}

fn eval(m: &Yolo) -> Vec<f32> {
    let (raw, _) = m.forward_raw(&batch(), Mode::Eval).unwrap();
    Tensor::cat(&[&raw.boxes, &raw.scores], 1).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn values(m: &Yolo, name: &str) -> Vec<f32> {
    m.var(name).unwrap().as_tensor().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn a_packed_copy_computes_as_the_model_and_its_parts_follow_the_buffer() {
    for family in [Family::V8, Family::V26] {
        let cfg = YoloConfig::new(Scale::N, 3).with_family(family);
        let model = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 3).unwrap();
        let (copy, packs) = model.try_clone_packed().unwrap();
        assert_eq!(eval(&copy), eval(&model), "{family:?}: the copy computes as the model");
        // One f32 buffer holding every floating-point variable, in the order of the model's segments: the
        // running-statistics buffers first, the rest by name.
        assert_eq!(packs.len(), 1);
        let pack = &packs[0];
        let names: Vec<&str> = pack.parts.iter().map(|(n, _)| n.as_str()).collect();
        let order: Vec<&str> = model.float_segments().iter().flat_map(|s| s.names.iter().map(|n| n.as_str())).collect();
        assert_eq!(names, order);
        assert!(names[0].ends_with(".running_mean"));
        let rest = &names[names.iter().rposition(|n| n.ends_with(".running_var")).unwrap() + 1..];
        assert!(rest.windows(2).all(|w| w[0] < w[1]));
        // Concatenating the segments lists the model's values in the buffer's order.
        let flat: Vec<Tensor> =
            model.float_segments().iter().map(|s| s.var.as_tensor().flatten_all().unwrap()).collect();
        assert_eq!(
            Tensor::cat(&flat, 0).unwrap().to_vec1::<f32>().unwrap(),
            pack.buffer.as_tensor().to_vec1::<f32>().unwrap()
        );
        let total: usize = pack.parts.iter().map(|(_, v)| v.elem_count()).sum();
        assert_eq!(pack.buffer.elem_count(), total);
        assert_eq!(names.len(), model.varmap().all_vars().len(), "{family:?}: every variable is a part");

        // The buffer takes new values in one op: every part, and the copy's forward, follows.
        let weight = "model.0.conv.weight";
        let bias = names.last().unwrap();
        let before_w = values(&copy, weight);
        let before_b = values(&copy, bias);
        pack.buffer.set_owned(pack.buffer.as_tensor().affine(0.5, 0.0).unwrap()).unwrap();
        let half = |v: &[f32]| v.iter().map(|x| x * 0.5).collect::<Vec<_>>();
        assert_eq!(values(&copy, weight), half(&before_w));
        assert_eq!(values(&copy, bias), half(&before_b));
        assert_ne!(eval(&copy), eval(&model), "the forward reads the buffer");
        assert_eq!(values(&model, weight), before_w, "the model itself is apart");

        // A write to one part (as loading a checkpoint does) lands in its range of the buffer only.
        let v = copy.var(weight).unwrap();
        v.set(&v.as_tensor().ones_like().unwrap()).unwrap();
        let at: usize = pack.parts.iter().take_while(|(n, _)| n != weight).map(|(_, v)| v.elem_count()).sum();
        let flat: Vec<f32> = pack.buffer.as_tensor().to_vec1().unwrap();
        assert!(flat[at..at + before_w.len()].iter().all(|&x| x == 1.0));
        assert_eq!(values(&copy, bias), half(&before_b));
    }
}

/// Every BatchNorm's running mean and variance, by name.
fn running_stats(m: &Yolo) -> Vec<(String, Vec<f32>)> {
    let mut names: Vec<String> =
        m.varmap().data().lock().unwrap().keys().filter(|k| k.contains(".running_")).cloned().collect();
    names.sort();
    names.into_iter().map(|n| (n.clone(), values(m, &n))).collect()
}

#[test]
fn the_running_statistics_update_over_one_buffer_equals_the_update_of_each_layer() {
    for family in [Family::V8, Family::V26] {
        let cfg = YoloConfig::new(Scale::N, 3).with_family(family);
        // A model built by `new` keeps its running statistics in buffers; a packed copy updates each layer on its
        // own (its parts belong to one buffer with every other variable).
        let model = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 5).unwrap();
        let (layerwise, _) = model.try_clone_packed().unwrap();
        let start = running_stats(&model);
        let x = (batch().affine(2.0, -0.5).unwrap().broadcast_as((2, 3, 64, 64)).unwrap().contiguous()).unwrap();
        for m in [&model, &layerwise] {
            for _ in 0..2 {
                let (_, feats) = m.forward_raw(&x, Mode::Train).unwrap();
                m.forward_one2one(&feats, Mode::Train).unwrap();
            }
        }
        let (a, b) = (running_stats(&model), running_stats(&layerwise));
        assert_eq!(a, b, "{family:?}: the buffers' update equals the layers' own, bit for bit");
        let moved = a.iter().zip(&start).filter(|(now, before)| now.1 != before.1).count();
        assert_eq!(moved, a.len(), "{family:?}: every running statistic moved");
    }
}

/// [`Yolo::with_params_packed`]: the model's own parameters as parts of one buffer per list. The forward and
/// the gradients are the unpacked model's bit for bit, a training forward still updates the running statistics,
/// the buffer is one segment, and a list that names a variable twice or a running statistic is refused.
#[test]
fn packed_parameters_compute_and_train_as_the_model() {
    let cfg = YoloConfig::new(Scale::N, 3);
    let seeded = || Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 4).unwrap();
    let model = seeded();
    let weights: Vec<String> =
        model.trainable_vars().into_iter().map(|(n, _)| n).filter(|n| n.ends_with(".conv.weight")).collect();
    let biases: Vec<String> =
        model.trainable_vars().into_iter().map(|(n, _)| n).filter(|n| n.ends_with(".bias")).rev().collect();
    let packed = seeded().with_params_packed(&[weights.clone(), biases.clone()]).unwrap();
    assert_eq!(packed.param_packs().len(), 2);
    assert_eq!(eval(&packed), eval(&model));
    let segments = packed.float_segments();
    assert!(
        segments
            .iter()
            .any(|s| s.names == weights && s.var.elem_count() == packed.param_packs()[0].buffer.elem_count())
    );
    let n_float = model.varmap().all_vars().into_iter().filter(|v| v.dtype().is_float()).count();
    assert_eq!(segments.iter().map(|s| s.names.len()).sum::<usize>(), n_float, "every variable once");
    // The running statistics keep their buffers; the packed variables leave their own segments for two.
    let expected = model.float_segments().len() - weights.len() - biases.len() + 2;
    assert_eq!(segments.len(), expected);
    // One training step's gradients, by name, and the running statistics it leaves.
    let grads = |m: &Yolo| -> Vec<Vec<f32>> {
        let (raw, _) = m.forward_raw(&batch(), Mode::Train).unwrap();
        let loss = (raw.boxes.sqr().unwrap().mean_all().unwrap() + raw.scores.mean_all().unwrap()).unwrap();
        let g = loss.backward().unwrap();
        m.trainable_vars()
            .iter()
            .map(|(n, v)| {
                let t = g.get(v.as_tensor()).unwrap_or_else(|| panic!("no gradient for {n}"));
                t.flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect()
    };
    assert!(grads(&packed) == grads(&model), "the gradients are the unpacked model's");
    assert!(running_stats(&packed) == running_stats(&model), "the running statistics follow");
    // The buffer takes new values in one op, and every part reads them.
    let pack = &packed.param_packs()[1];
    pack.buffer.set_owned(pack.buffer.as_tensor().affine(0.0, 0.25).unwrap()).unwrap();
    assert!(values(&packed, &biases[0]).iter().all(|&x| x == 0.25));
    assert_ne!(eval(&packed), eval(&model));
    for bad in [
        vec![weights[0].clone(), weights[0].clone()],
        vec!["model.0.bn.running_mean".to_string()],
        vec!["model.0.nothing".to_string()],
    ] {
        let err = seeded().with_params_packed(std::slice::from_ref(&bad)).unwrap_err().to_string();
        assert!(err.contains(&bad[0]), "{bad:?}: {err}");
    }
}
