//! Statistics of drawn recipes: every random parameter stays in its configured range and follows its
//! distribution (uniform ranges' means and spreads, flip and mosaic rates, uniform mosaic partners).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sluice_augment::{Hyp, Layout, RecipeSampler};

const N: u64 = 20_000;

/// Mean and variance of `xs`.
fn moments(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (mean, xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n)
}

/// Checks that `xs` looks like `U(lo, hi)`: inside the range, mean and variance within 5 standard errors.
fn assert_uniform(name: &str, xs: &[f64], lo: f64, hi: f64) {
    assert!(xs.iter().all(|&x| x >= lo && x < hi.max(lo + f64::EPSILON)), "{name} outside [{lo}, {hi})");
    let (mean, var) = moments(xs);
    let (want_mean, want_var) = ((lo + hi) / 2.0, (hi - lo).powi(2) / 12.0);
    let n = xs.len() as f64;
    let se_mean = (want_var / n).sqrt();
    assert!((mean - want_mean).abs() <= 5.0 * se_mean + 1e-12, "{name}: mean {mean} vs {want_mean}");
    // Variance of the sample variance of a uniform: (hi-lo)^4 / 180 / n.
    let se_var = ((hi - lo).powi(4) / 180.0 / n).sqrt();
    assert!((var - want_var).abs() <= 5.0 * se_var + 1e-12, "{name}: variance {var} vs {want_var}");
}

fn assert_rate(name: &str, hits: usize, n: usize, p: f64) {
    let rate = hits as f64 / n as f64;
    let se = (p * (1.0 - p) / n as f64).sqrt();
    assert!((rate - p).abs() <= 5.0 * se + 1e-12, "{name}: rate {rate} vs {p}");
}

#[test]
fn parameters_follow_their_configured_distributions() {
    let hyp =
        Hyp { degrees: 12.0, shear: 3.0, perspective: 0.0005, flipud: 0.3, mosaic: 0.8, mixup: 0.25, ..Hyp::default() };
    let len = 10u64;
    let imgsz = 640;
    let sampler = RecipeSampler::new(hyp, len).expect("sampler");
    let recipes: Vec<_> =
        (0..N).map(|i| sampler.draw(i % len, imgsz, true, &mut ChaCha8Rng::seed_from_u64(i))).collect();
    let n = recipes.len();

    let p = |f: &dyn Fn(&sluice_augment::PerspectiveParams) -> f64| -> Vec<f64> {
        recipes.iter().map(|r| f(&r.geometry.perspective)).collect()
    };
    assert_uniform("degrees", &p(&|q| q.angle_deg), -12.0, 12.0);
    assert_uniform("scale", &p(&|q| q.scale), 0.5, 1.5);
    assert_uniform("shear_x", &p(&|q| q.shear_x_deg), -3.0, 3.0);
    assert_uniform("shear_y", &p(&|q| q.shear_y_deg), -3.0, 3.0);
    assert_uniform("perspective_x", &p(&|q| q.perspective_x), -0.0005, 0.0005);
    assert_uniform("perspective_y", &p(&|q| q.perspective_y), -0.0005, 0.0005);
    assert_uniform("translate_x", &p(&|q| q.translate_x), 0.4, 0.6);
    assert_uniform("translate_y", &p(&|q| q.translate_y), 0.4, 0.6);

    let hsv: Vec<_> = recipes.iter().map(|r| r.hsv.expect("hsv configured")).collect();
    assert_uniform("hsv_h", &hsv.iter().map(|g| g.h).collect::<Vec<_>>(), -0.015, 0.015);
    assert_uniform("hsv_s", &hsv.iter().map(|g| g.s).collect::<Vec<_>>(), -0.7, 0.7);
    assert_uniform("hsv_v", &hsv.iter().map(|g| g.v).collect::<Vec<_>>(), -0.4, 0.4);

    assert_rate("fliplr", recipes.iter().filter(|r| r.flip_lr).count(), n, 0.5);
    assert_rate("flipud", recipes.iter().filter(|r| r.flip_ud).count(), n, 0.3);
    assert_rate("mixup", recipes.iter().filter(|r| r.mixup.is_some()).count(), n, 0.25);
    let mosaics: Vec<_> = recipes
        .iter()
        .filter_map(|r| match r.geometry.layout {
            Layout::Mosaic4 { ids, centre } => Some((ids, centre)),
            Layout::Single { .. } => None,
        })
        .collect();
    assert_rate("mosaic", mosaics.len(), n, 0.8);

    // Mosaic centres: int(U(320, 960)) -> integers 320..=959, roughly uniform.
    let xs: Vec<f64> = mosaics.iter().map(|(_, c)| f64::from(c.0) + 0.5).collect();
    let ys: Vec<f64> = mosaics.iter().map(|(_, c)| f64::from(c.1) + 0.5).collect();
    assert_uniform("centre_x", &xs, 320.0, 960.0);
    assert_uniform("centre_y", &ys, 320.0, 960.0);

    // Partners: uniform over the dataset (chi-square over the 10 ids, 9 degrees of freedom; 99.9% quantile 27.9).
    let mut counts = [0f64; 10];
    for (ids, _) in &mosaics {
        for &id in &ids[1..] {
            counts[id as usize] += 1.0;
        }
    }
    let expect = counts.iter().sum::<f64>() / 10.0;
    let chi2: f64 = counts.iter().map(|c| (c - expect).powi(2) / expect).sum();
    assert!(chi2 < 27.9, "partner ids are not uniform: chi2 {chi2}, counts {counts:?}");

    // Mixup ratio: Beta(32, 32) has mean 0.5 and variance 1/260.
    let ratios: Vec<f64> = recipes.iter().filter_map(|r| r.mixup.map(|m| f64::from(m.ratio))).collect();
    let (mean, var) = moments(&ratios);
    assert!((mean - 0.5).abs() < 0.01 && (var - 1.0 / 260.0).abs() < 0.0008, "beta: {mean} {var}");
    assert!(ratios.iter().all(|&r| r > 0.0 && r < 1.0));
}
