//! Each rule against torch's documented update written out in f64 on small tensors, over several steps
//! with changing learning rate and momentum (as during warmup).
#![allow(clippy::unwrap_used)]
use candle_core::{Device, Var};

use super::*;
use crate::groups::{Group, Param};

/// Deterministic pseudo-random values in [−1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<f32>>(), v.len(), &Device::Cpu).unwrap()
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1().unwrap()
}

/// One parameter per group, so every group's hyper-parameters are exercised.
fn optimizer(rule: Rule, init: &[Vec<f64>; 3]) -> Optimizer {
    let groups = [Group::Weight, Group::BnWeight, Group::Bias];
    let params = groups
        .iter()
        .zip(init)
        .map(|(g, v)| Param {
            name: format!("{g:?}"),
            var: Var::from_tensor(&tensor(v)).unwrap(),
            group: *g,
            boosted: false,
        })
        .collect();
    Optimizer::new(rule, ParamGroups::from_params(params, false))
}

fn hyper(step: usize) -> [GroupHyper; 3] {
    // Learning rate and momentum change every step, like warmup; only group 0 decays.
    let lr = 0.01 * (1.0 + step as f64) / 3.0;
    let m = 0.8 + 0.04 * step as f64;
    [
        GroupHyper { lr, momentum: m, weight_decay: 5e-3 },
        GroupHyper { lr, momentum: m, weight_decay: 0.0 },
        GroupHyper { lr: 0.1 - 0.02 * step as f64, momentum: m, weight_decay: 0.0 },
    ]
}

/// f64 reference: torch.optim.SGD docs (nesterov, dampening 0).
fn sgd_ref(p: &mut [f64], buf: &mut Option<Vec<f64>>, g: &[f64], h: GroupHyper) {
    let gt: Vec<f64> = g.iter().zip(p.iter()).map(|(g, p)| g + h.weight_decay * p).collect();
    let b: Vec<f64> = match buf {
        None => gt.clone(),
        Some(b) => b.iter().zip(&gt).map(|(b, g)| h.momentum * b + g).collect(),
    };
    for i in 0..p.len() {
        p[i] -= h.lr * (gt[i] + h.momentum * b[i]);
    }
    *buf = Some(b);
}

/// f64 reference: torch.optim.Adam / AdamW docs.
fn adam_ref(p: &mut [f64], m: &mut [f64], v: &mut [f64], t: u64, g: &[f64], h: GroupHyper, decoupled: bool) {
    let (b1, b2) = (h.momentum, ADAM_BETA2);
    for i in 0..p.len() {
        let mut gi = g[i];
        if decoupled {
            p[i] *= 1.0 - h.lr * h.weight_decay;
        } else {
            gi += h.weight_decay * p[i];
        }
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        let mh = m[i] / (1.0 - b1.powi(t as i32));
        let vh = v[i] / (1.0 - b2.powi(t as i32));
        p[i] -= h.lr * mh / (vh.sqrt() + ADAM_EPS);
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // float32 arithmetic against f64: a few ulps of the parameter scale.
        assert!((g - w).abs() <= 2e-6 * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

fn run(rule: Rule) {
    let n = 7;
    let init = [values(n, 1), values(n, 2), values(n, 3)];
    let mut opt = optimizer(rule, &init);
    let mut p = init.clone();
    let mut bufs: [Option<Vec<f64>>; 3] = [None, None, None];
    let mut ms = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
    let mut vs = ms.clone();
    for step in 0..5 {
        let g: Vec<Vec<f64>> = (0..3).map(|k| values(n, 100 + 10 * step as u64 + k)).collect();
        let h = hyper(step);
        let grads: Vec<Option<Tensor>> = g.iter().map(|g| Some(tensor(g))).collect();
        opt.step(&grads, &h).unwrap();
        for k in 0..3 {
            match rule {
                Rule::Sgd => sgd_ref(&mut p[k], &mut bufs[k], &g[k], h[k]),
                Rule::Adam | Rule::AdamW => {
                    adam_ref(&mut p[k], &mut ms[k], &mut vs[k], step as u64 + 1, &g[k], h[k], rule == Rule::AdamW)
                }
                Rule::MuSgd => unreachable!("tested below"),
            }
            let got = read(opt.groups().params()[k].var.as_tensor());
            // Compare against the reference advanced from the float32 parameters, so errors do not compound.
            assert_close(&got, &p[k], &format!("{rule:?} step {step} group {k}"));
            p[k] = got;
        }
    }
    assert!(opt.state().iter().all(|s| s.step == 5));
    // No state tensor carries an autograd graph (which would chain every step's buffers together).
    for st in opt.state() {
        for t in [&st.momentum_buffer, &st.exp_avg, &st.exp_avg_sq].into_iter().flatten() {
            assert!(!t.track_op(), "{rule:?}: optimizer state is tracked by autograd");
        }
    }
}

#[test]
fn sgd_nesterov_matches_torch_rule() {
    run(Rule::Sgd);
}

#[test]
fn adam_matches_torch_rule() {
    run(Rule::Adam);
}

#[test]
fn adamw_matches_torch_rule() {
    run(Rule::AdamW);
}

#[test]
fn a_parameter_without_gradient_is_left_alone() {
    let init = [values(3, 1), values(3, 2), values(3, 3)];
    let mut opt = optimizer(Rule::AdamW, &init);
    let grads = vec![Some(tensor(&values(3, 9))), None, Some(tensor(&values(3, 8)))];
    opt.step(&grads, &hyper(0)).unwrap();
    assert_eq!(read(opt.groups().params()[1].var.as_tensor()), read(&tensor(&init[1])));
    assert_eq!(opt.state()[1].step, 0);
    assert!(opt.state()[1].exp_avg.is_none());
    assert_eq!(opt.state()[0].step, 1);
}

#[test]
fn muon_batches_transpose_as_ultralytics() {
    // Columns 72: rows 128, 32, 16 share a batch (128 ≤ 16·16) padded to 128 > 72 rows, so all three are
    // transposed; rows 4 start a new batch (128 > 16·4) of 4 rows, not transposed. Columns 9: one 3-row
    // matrix, not transposed; a 2-D 40×8 weight (scale √5) is alone in its bucket and transposed.
    let shapes = [
        Some(muon_matrix(&[32, 8, 3, 3])),
        Some(muon_matrix(&[128, 8, 3, 3])),
        None,
        Some(muon_matrix(&[4, 8, 3, 3])),
        Some(muon_matrix(&[16, 8, 3, 3])),
        Some(muon_matrix(&[3, 1, 3, 3])),
        Some(muon_matrix(&[40, 8])),
    ];
    assert_eq!(muon_matrix(&[40, 8]), (40, 8, 5f64.sqrt()));
    assert_eq!(muon_matrix(&[32, 8, 3, 3]), (32, 72, 1.0));
    assert_eq!(muon_transposes(&shapes), [true, true, false, false, true, false, true]);
}

#[test]
fn newton_schulz_orthogonalises() {
    // Singular values of the result lie near 1 (Ultralytics' coefficients give roughly 0.7–1.2), whatever the
    // input's scale and orientation.
    let v = values(12 * 20, 11);
    let g = Tensor::from_vec(v.iter().map(|&x| x as f32 * 1e-3).collect::<Vec<_>>(), (12, 20), &Device::Cpu).unwrap();
    for (m, transpose) in [(g.clone(), false), (g.t().unwrap().contiguous().unwrap(), true)] {
        let o = newton_schulz5(&m, transpose).unwrap();
        let small = if transpose { o.t().unwrap().matmul(&o).unwrap() } else { o.matmul(&o.t().unwrap()).unwrap() };
        let d: Vec<Vec<f32>> = small.to_vec2().unwrap();
        for (i, row) in d.iter().enumerate() {
            assert!((0.4..1.5).contains(&row[i]), "diagonal {i}: {}", row[i]);
        }
    }
}

/// Two MuSGD steps on a Muon group (a conv filter and a matrix) against Ultralytics 8.4.190's own `MuSGD` with
/// its `muon=0.2, sgd=1.0` (`tests/data/musgd_one_step/make_musgd_one_step.py`): the Muon update weighted 0.2 and
/// the Nesterov SGD update on the second buffer weighted 1.0, each step's update within the rounding Ultralytics'
/// bfloat16 Newton-Schulz itself allows (the fixture's `spread`: its update against a float32 iteration's).
#[test]
fn musgd_muon_group_matches_ultralytics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/musgd_one_step/musgd_one_step.json");
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    };
    let shapes: Vec<Vec<usize>> = fx["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect())
        .collect();
    assert_eq!((fx["muon"].as_f64(), fx["sgd"].as_f64()), (Some(MUSGD_MUON), Some(MUSGD_SGD)));
    let on = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let params = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| Param {
            name: format!("model.{i}.conv.weight"),
            var: Var::from_tensor(&on(floats(&fx["init"][i]), s)).unwrap(),
            group: Group::Muon,
            boosted: false,
        })
        .collect();
    let mut opt = Optimizer::new(Rule::MuSgd, ParamGroups::from_params(params, true));
    let h = GroupHyper {
        lr: fx["hyper"]["lr"].as_f64().unwrap(),
        momentum: fx["hyper"]["momentum"].as_f64().unwrap(),
        weight_decay: fx["hyper"]["weight_decay"].as_f64().unwrap(),
    };
    let hyper = vec![h; opt.groups().len()];
    for step in 0..2 {
        let before: Vec<Vec<f32>> =
            opt.groups().params().iter().map(|p| p.var.flatten_all().unwrap().to_vec1().unwrap()).collect();
        let grads: Vec<Option<Tensor>> =
            shapes.iter().enumerate().map(|(i, s)| Some(on(floats(&fx["grads"][step][i]), s))).collect();
        opt.step(&grads, &hyper).unwrap();
        let bound = fx["spread"][step].as_f64().unwrap() as f32;
        for (i, p) in opt.groups().params().iter().enumerate() {
            // Each step's update against Ultralytics' update of that step (from its own previous values).
            let got: Vec<f32> = p.var.flatten_all().unwrap().to_vec1().unwrap();
            let prev = if step == 0 { floats(&fx["init"][i]) } else { floats(&fx["after"][step - 1][i]) };
            let want: Vec<f32> = floats(&fx["after"][step][i]).iter().zip(&prev).map(|(a, b)| a - b).collect();
            let got: Vec<f32> = got.iter().zip(&before[i]).map(|(a, b)| a - b).collect();
            let size = want.iter().fold(0f32, |m, w| m.max(w.abs()));
            let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max) / size;
            println!("step {step}, {}: update differs by {worst:e} of its size (bound {bound:e})", p.name);
            assert!(worst <= bound, "step {step}, {}: {worst} > {bound}", p.name);
        }
    }
}

#[test]
fn clipping_matches_torch() {
    let a = values(50, 4).iter().map(|x| x * 3.0).collect::<Vec<_>>();
    let b = values(20, 5);
    let want = a.iter().chain(&b).map(|x| x * x).sum::<f64>().sqrt();
    let mut grads = vec![Some(tensor(&a)), None, Some(tensor(&b))];
    let norm = total_grad_norm(&grads).unwrap();
    assert!((norm - want).abs() < 1e-5 * want, "{norm} vs {want}");
    assert!(want > MAX_GRAD_NORM);
    let coef = clip_coefficient(norm, MAX_GRAD_NORM);
    assert!((coef - MAX_GRAD_NORM / (want + 1e-6)).abs() < 1e-6);
    scale_grads(&mut grads, coef).unwrap();
    let clipped = total_grad_norm(&grads).unwrap();
    assert!((clipped - MAX_GRAD_NORM).abs() < 1e-4, "{clipped}");
    // Below the threshold the factor is exactly 1.
    assert_eq!(clip_coefficient(3.0, MAX_GRAD_NORM), 1.0);
    assert!(total_grad_norm(&[Some(tensor(&[f64::NAN]))]).unwrap().is_nan());
}
