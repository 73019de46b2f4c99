//! Criterion bench of one optimizer step + EMA update over yolov8n's parameters (3.0 M scalars in 183 tensors,
//! EMA over all 3.0 M + running statistics) on the CPU backend: SGD (Nesterov) against AdamW and MuSGD (its
//! Newton–Schulz iterations on every conv filter), with the gradient clipping norm, measured in the same run; the
//! EMA update alone is the baseline all include. Each rule also over the model as the trainer packs it on a GPU
//! (`Optimization::pack_model`: each element-wise group's parameters in one buffer, updated as one flat tensor).

use candle_core::{DType, Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_model::{Scale, Yolo, YoloConfig};
use sluice_optim::optimizer::{GroupHyper, MAX_GRAD_NORM, clip_coefficient, scale_grads, total_grad_norm};
use sluice_optim::{ModelEma, Optimizer, ParamGroups, Rule};

/// The model with each element-wise group of `rule` packed into one buffer, and its groups.
fn packed(model: &Yolo, rule: Rule) -> (Yolo, ParamGroups) {
    let groups = |m: &Yolo| if rule == Rule::MuSgd { ParamGroups::new_muon(m) } else { ParamGroups::new(m) };
    let lists = Optimizer::new(rule, groups(model).expect("groups")).flat_groups();
    let m = model.try_clone().expect("copy").with_params_packed(&lists).expect("packed");
    let g = groups(&m).expect("groups");
    (m, g)
}

fn step(c: &mut Criterion) {
    let dev = Device::Cpu;
    let model = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &dev).expect("model");
    let groups = ParamGroups::new(&model).expect("groups");
    let grads: Vec<Option<Tensor>> =
        groups.params().iter().map(|p| Some(Tensor::randn(0f32, 1e-3, p.var.shape(), &dev).expect("grad"))).collect();
    let hyper = vec![
        GroupHyper { lr: 0.01, momentum: 0.937, weight_decay: 5e-4 },
        GroupHyper { lr: 0.01, momentum: 0.937, weight_decay: 0.0 },
        GroupHyper { lr: 0.01, momentum: 0.937, weight_decay: 0.0 },
    ];
    let mut g = c.benchmark_group("optim_yolov8n_cpu");
    g.throughput(Throughput::Elements(groups.numel() as u64));
    g.sample_size(20);

    let mut ema = ModelEma::new(&model).expect("ema");
    g.bench_function("ema_update", |b| b.iter(|| ema.update(&model).expect("ema")));

    let muon_groups = ParamGroups::new_muon(&model).expect("groups");
    let muon_hyper: Vec<GroupHyper> = (0..muon_groups.len()).map(|i| hyper[(i / 2).min(2)]).collect();
    for rule in [Rule::Sgd, Rule::AdamW, Rule::MuSgd] {
        let hyper = if rule == Rule::MuSgd { &muon_hyper } else { &hyper };
        let plain =
            (model.try_clone().expect("copy"), if rule == Rule::MuSgd { muon_groups.clone() } else { groups.clone() });
        for (suffix, (model, groups)) in [("", plain), ("_packed", packed(&model, rule))] {
            let mut opt = Optimizer::new(rule, groups);
            let used = opt.use_buffers(model.param_packs());
            assert_eq!(used > 0, suffix == "_packed");
            let mut ema = ModelEma::new(&model).expect("ema");
            g.bench_function(format!("{}_clip_step_ema{suffix}", rule.name()), |b| {
                b.iter(|| {
                    let mut gr = grads.clone();
                    let norm = total_grad_norm(&gr).expect("norm");
                    scale_grads(&mut gr, clip_coefficient(norm, MAX_GRAD_NORM)).expect("clip");
                    opt.step(&gr, hyper).expect("step");
                    ema.update(&model).expect("ema");
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
