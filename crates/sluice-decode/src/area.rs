//! Area interpolation exactly as OpenCV's `INTER_AREA` computes it for shrinking: each output pixel is the mean
//! of the source area it covers, partially covered source pixels weighted by their covered fraction (OpenCV's
//! `computeResizeAreaTab`). `fast_image_resize`'s box filter equals this for integer factors only (a source pixel
//! is either in or out of its window), so fractional factors — which DCT-scaled decodes produce — use this
//! separable implementation.

use sluice_core::ImageRgb8;

/// One source pixel's contribution to one destination pixel along an axis.
#[derive(Debug, Clone, Copy)]
struct Tap {
    src: usize,
    dst: usize,
    weight: f32,
}

/// OpenCV's area table for `extent` source pixels (the region `[0, extent)`, `extent <= src_len`) onto `dst_len`.
fn taps(extent: f64, src_len: usize, dst_len: usize) -> Vec<Tap> {
    let scale = extent / dst_len as f64;
    let mut taps = Vec::with_capacity(src_len + dst_len * 2);
    let last = src_len as f64 - 1.0;
    for dst in 0..dst_len {
        let fsx1 = dst as f64 * scale;
        let fsx2 = fsx1 + scale;
        let cell = scale.min(extent - fsx1).max(f64::MIN_POSITIVE);
        let sx2 = fsx2.floor().min(last);
        let sx1 = fsx1.ceil().min(sx2);
        if sx1 - fsx1 > 1e-3 && sx1 >= 1.0 {
            taps.push(Tap { src: sx1 as usize - 1, dst, weight: ((sx1 - fsx1) / cell) as f32 });
        }
        let mut sx = sx1;
        while sx < sx2 {
            taps.push(Tap { src: sx as usize, dst, weight: (1.0 / cell) as f32 });
            sx += 1.0;
        }
        if fsx2 - sx2 > 1e-3 {
            taps.push(Tap { src: sx2 as usize, dst, weight: ((fsx2 - sx2).min(1.0).min(cell) / cell) as f32 });
        }
    }
    taps.sort_by_key(|t| (t.src, t.dst));
    taps
}

/// Resamples the region `[0, extent_w) x [0, extent_h)` of `src` to `width x height` into `out` (already reset to
/// that size) by area averaging. Rounds to nearest like OpenCV's `saturate_cast`.
pub(crate) fn resize_area(src: &ImageRgb8, extent_w: f64, extent_h: f64, width: u32, height: u32, out: &mut ImageRgb8) {
    let (dw, dh) = (width as usize, height as usize);
    let xt = taps(extent_w, src.width() as usize, dw);
    let yt = taps(extent_h, src.height() as usize, dh);
    // Horizontal sums of the current source row, and the vertical accumulation of every destination row (the
    // y taps are sorted by source row, so destination rows finish out of order; one f32 plane holds them all).
    let mut row = vec![0f32; dw * 3];
    let mut acc = vec![0f32; dw * 3 * dh];
    let mut current = usize::MAX;
    for t in &yt {
        if t.src != current {
            current = t.src;
            row.fill(0.0);
            let s = src.row(current as u32);
            for x in &xt {
                let (i, o) = (x.src * 3, x.dst * 3);
                row[o] += f32::from(s[i]) * x.weight;
                row[o + 1] += f32::from(s[i + 1]) * x.weight;
                row[o + 2] += f32::from(s[i + 2]) * x.weight;
            }
        }
        let dst = &mut acc[t.dst * dw * 3..(t.dst + 1) * dw * 3];
        for (a, r) in dst.iter_mut().zip(&row) {
            *a += r * t.weight;
        }
    }
    for y in 0..height {
        let a = &acc[y as usize * dw * 3..(y as usize + 1) * dw * 3];
        for (o, v) in out.row_mut(y).iter_mut().zip(a) {
            *o = v.round_ties_even().clamp(0.0, 255.0) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_of_each_output_sum_to_one() {
        for (extent, src, dst) in [(500.0, 500, 200), (187.5, 188, 150), (7.0, 7, 3), (160.0, 160, 64)] {
            let t = taps(extent, src, dst);
            let mut sums = vec![0f64; dst];
            for tap in &t {
                assert!(tap.src < src);
                sums[tap.dst] += f64::from(tap.weight);
            }
            for (d, s) in sums.iter().enumerate() {
                assert!((s - 1.0).abs() < 1e-5, "extent {extent} -> {dst}: output {d} weights sum to {s}");
            }
        }
    }
}
