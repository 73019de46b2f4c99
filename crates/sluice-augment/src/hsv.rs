//! HSV colour-space augmentation with Ultralytics' semantics (`RandomHSV`, Ultralytics >= 8.3.79): random gains
//! `r = U(-1, 1) * (hsv_h, hsv_s, hsv_v)`, three 256-entry lookup tables (hue shifted by `r_h * 180` modulo 180,
//! saturation and value multiplied by `1 + r`, clipped and truncated), applied in OpenCV's 8-bit HSV space
//! (`COLOR_RGB2HSV`: H in 0..180, fixed-point divisions with 12-bit tables; `COLOR_HSV2RGB`: float sectors,
//! rounded half to even). [`HsvLut::apply`] is the fast per-pixel path, [`HsvLut::apply_planes`] the same over
//! rows of channel planes in vectorisable stages (the fused sampler's row path); [`hsv_reference`] evaluates the
//! same definitions per pixel from the gains, without any table.

use serde::{Deserialize, Serialize};

/// One sample's HSV gains `r` (each `U(-1, 1)` times the configured gain).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HsvGains {
    /// Hue: the hue moves by `h * 180` (in OpenCV's 0..180 hue units).
    pub h: f64,
    /// Saturation: multiplied by `1 + s`.
    pub s: f64,
    /// Value: multiplied by `1 + v`.
    pub v: f64,
}

const HSV_SHIFT: u32 = 12;
const HSV_ROUND: i32 = 1 << (HSV_SHIFT - 1);
const HUE_RANGE: i32 = 180;

/// Pixels per run of [`HsvLut::apply_planes`]'s stages.
const RUN: usize = 64;

/// OpenCV's `sdiv_table`: `round((255 << 12) / i)`, 0 for 0 (exact halves never occur for `i < 256`).
const SDIV: [i32; 256] = {
    let mut t = [0i32; 256];
    let mut i = 1;
    while i < 256 {
        let num = 255i64 << HSV_SHIFT;
        t[i] = ((2 * num + i as i64) / (2 * i as i64)) as i32;
        i += 1;
    }
    t
};

/// OpenCV's `hdiv_table180`: `round((180 << 12) / (6 i))`, 0 for 0.
const HDIV: [i32; 256] = {
    let mut t = [0i32; 256];
    let mut i = 1;
    while i < 256 {
        let num = (HUE_RANGE as i64) << HSV_SHIFT;
        let den = 6 * i as i64;
        t[i] = ((2 * num + den) / (2 * den)) as i32;
        i += 1;
    }
    t
};

/// The lookup tables of one sample: Ultralytics' three 256-entry tables, and the same tables pre-converted to what
/// the HSV → RGB step consumes, so the per-pixel work is integer RGB → HSV, a few table reads, two
/// multiplications, two roundings and a byte permutation.
///
/// OpenCV's HSV → RGB spreads `tab = [v, p, q, t]` (`p = v(1 - s)`, `q = v(1 - s f)`, `t = v(1 - s(1 - f))`) over
/// (r, g, b) by sector, and every sector uses `v`, `p` and one of `q` (odd sectors) or `t` (even ones). So per
/// hue entry the tables hold the factor of that third value (`f` or `1 - f`, the same single-precision value OpenCV
/// computes) and the sector's permutation of `(v, p, third)` as byte shifts; `v`'s rounding,
/// `saturate_cast<uchar>(255 * (val / 255))`, is `val` itself (tested for every byte). The results are those of
/// OpenCV's formula, bit for bit (tested against [`hsv_reference`]). [`Self::apply_planes`] reads only `hue`,
/// `sat_f` and `val` and computes the rest (the divisions, the sector and its factor) in vector arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub struct HsvLut {
    hue: [u8; 256],
    sat: [u8; 256],
    val: [u8; 256],
    /// Per augmented hue: `f` (odd sector) or `1 - f` (even sector).
    hue_g: [f32; 256],
    /// Per augmented hue: the shifts that pick r, g, b (bits 0, 8, 16) out of `v | p << 8 | third << 16`.
    hue_shifts: [u32; 256],
    sat_f: [f32; 256],
    val_f: [f32; 256],
}

/// NumPy's `float % 180` (result in `[0, 180)`), then `astype(uint8)` (truncation).
fn hue_entry(x: f64, shift: f64) -> u8 {
    let m = (x + shift).rem_euclid(180.0);
    m as u8
}

/// `clip(x * gain, 0, 255).astype(uint8)`.
fn gain_entry(x: f64, gain: f64) -> u8 {
    (x * gain).clamp(0.0, 255.0) as u8
}

const HSCALE: f32 = 6.0 / 180.0;
const INV255: f32 = 1.0 / 255.0;

/// OpenCV's sector and in-sector fraction of an 8-bit hue (`h * 6/180`, wrapped into `[0, 6)`).
fn sector_of(h: u8) -> (u8, f32) {
    let mut hf = f32::from(h) * HSCALE;
    if hf >= 6.0 {
        hf -= 6.0; // h <= 255, so one subtraction is enough
    }
    let sector = hf as u8; // floor: hf >= 0
    if sector >= 6 { (0, 0.0) } else { (sector, hf - f32::from(sector)) }
}

/// `SDIV`'s numerator, `255 << 12`, and `HDIV`'s, `(180 << 12) / 6`.
const SDIV_NUM: f32 = 1_044_480.0;
const HDIV_NUM: f32 = 122_880.0;

/// `round(num / x)` for `num < 2^23`, 0 for `x = 0`: the single-precision quotient rounded to an integer by adding
/// `2^23` (the sum's low mantissa bits; an infinite quotient leaves them 0). For OpenCV's two tables this is their
/// entry for every byte (tested: the quotient's rounding error never moves it across a half), and it vectorises.
#[inline(always)]
fn div_round(num: f32, x: u8) -> i32 {
    ((num / f32::from(x) + 8_388_608.0).to_bits() & 0x7f_ffff) as i32
}

/// [`HsvLut`]'s per-hue entries from the augmented hue: OpenCV's sector and the factor of the third value (`f` in
/// odd sectors, `1 - f` in even ones), the same floats as [`sector_of`] gives, in a form that vectorises: the
/// sector in integers (`h * 6/180` never rounds across an integer: `6/180` rounds up in single precision, and a
/// multiple of 30 times it rounds to at most one ulp above the integer), no branches, no saturating conversion.
/// Tested equal to `sector_of` for every byte.
#[inline(always)]
fn hue_factor(h: u8) -> (u8, f32) {
    // `sector_of`'s wrap (`hf >= 6`) is `h >= 180`; its out-of-range case cannot arise for a byte.
    let wrap = h >= 180;
    let hf = f32::from(h) * HSCALE;
    let hf = if wrap { hf - 6.0 } else { hf };
    let k = h / 30;
    let sector = if wrap { k - 6 } else { k };
    let f = hf - f32::from(sector);
    (sector, if sector & 1 == 1 { f } else { 1.0 - f })
}

impl HsvLut {
    /// Builds the tables for `gains` (Ultralytics' `lut_hue`, `lut_sat` with `lut_sat[0] = 0`, `lut_val`).
    pub fn new(gains: HsvGains) -> Self {
        let mut lut = Self {
            hue: [0; 256],
            sat: [0; 256],
            val: [0; 256],
            hue_g: [0.0; 256],
            hue_shifts: [0; 256],
            sat_f: [0.0; 256],
            val_f: [0.0; 256],
        };
        for i in 0..256 {
            let x = i as f64;
            lut.hue[i] = hue_entry(x, gains.h * 180.0);
            lut.sat[i] = gain_entry(x, gains.s + 1.0);
            lut.val[i] = gain_entry(x, gains.v + 1.0);
        }
        lut.sat[0] = 0;
        // The slot of each of `tab`'s entries in `v | p << 8 | third << 16`: v, p, q and t (q and t are the third).
        const SLOT: [u32; 4] = [0, 1, 2, 2];
        for i in 0..256 {
            let (sector, f) = sector_of(lut.hue[i]);
            let sector = usize::from(sector.min(5));
            lut.hue_g[i] = if sector % 2 == 1 { f } else { 1.0 - f };
            let [r, g, b] = PERM[sector].map(|k| 8 * SLOT[usize::from(k & 3)]);
            lut.hue_shifts[i] = r | g << 8 | b << 16;
            lut.sat_f[i] = f32::from(lut.sat[i]) * INV255;
            lut.val_f[i] = f32::from(lut.val[i]) * INV255;
        }
        lut
    }

    /// The hue, saturation and value tables.
    pub fn tables(&self) -> (&[u8; 256], &[u8; 256], &[u8; 256]) {
        (&self.hue, &self.sat, &self.val)
    }

    /// [`Self::apply`] to every pixel of three channel rows (`r[i], g[i], b[i]` is pixel `i`, for `i` below the
    /// shortest row's length), in place.
    ///
    /// In runs of `RUN` pixels, stage by stage, so that all but the table reads are plain loops over arrays,
    /// which the compiler vectorises: the largest channel, the spread and the hue numerator (`rgb_to_hsv`'s first
    /// half, on bytes); OpenCV's two fixed-point divisions, with the table entries computed as rounded
    /// single-precision quotients (`div_round`), giving H and S; three table reads per pixel (`hue`, `sat_f`,
    /// `val`, the only ones: the compiler emits them as scalar loads); the sector and its factor from the
    /// augmented hue (`hue_factor`); the two roundings of `p` and the third value (floats); the sector's choice
    /// of `(v, p, third)` per channel (byte selects). The same bytes as `apply` (tested on every 24-bit colour,
    /// in the baseline and the AVX2 build). Every run is a whole fixed-size array (a shorter last run is padded
    /// into one): loops of a constant trip count vectorise without a scalar remainder. Always inlined, so that a
    /// caller compiled for wider vectors (the fused sampler's AVX2 row path) gets these loops at its width.
    #[inline(always)]
    pub fn apply_planes(&self, r: &mut [u8], g: &mut [u8], b: &mut [u8]) {
        let n = r.len().min(g.len()).min(b.len());
        let (r, g, b) = (&mut r[..n], &mut g[..n], &mut b[..n]);
        let (r_runs, r_tail) = r.as_chunks_mut::<RUN>();
        let (g_runs, g_tail) = g.as_chunks_mut::<RUN>();
        let (b_runs, b_tail) = b.as_chunks_mut::<RUN>();
        for ((r, g), b) in r_runs.iter_mut().zip(g_runs).zip(b_runs) {
            self.apply_run(r, g, b);
        }
        let k = r_tail.len();
        if k > 0 {
            let (mut r, mut g, mut b) = ([0u8; RUN], [0u8; RUN], [0u8; RUN]);
            r[..k].copy_from_slice(r_tail);
            g[..k].copy_from_slice(g_tail);
            b[..k].copy_from_slice(b_tail);
            self.apply_run(&mut r, &mut g, &mut b);
            r_tail.copy_from_slice(&r[..k]);
            g_tail.copy_from_slice(&g[..k]);
            b_tail.copy_from_slice(&b[..k]);
        }
    }

    /// [`Self::apply_planes`] over one run of [`RUN`] pixels.
    #[inline(always)]
    fn apply_run(&self, r: &mut [u8; RUN], g: &mut [u8; RUN], b: &mut [u8; RUN]) {
        let (mut vv, mut dd, mut hn) = ([0u8; RUN], [0u8; RUN], [0i16; RUN]);
        let (mut vf, mut sf, mut hg) = ([0f32; RUN], [0f32; RUN], [0f32; RUN]);
        let mut sec = [0u8; RUN];
        let (mut p8, mut t8) = ([0u8; RUN], [0u8; RUN]);
        for i in 0..RUN {
            let (rr, gg, bb) = (r[i], g[i], b[i]);
            let v = rr.max(gg).max(bb);
            let d = v - rr.min(gg).min(bb);
            let (ri, gi, bi, di) = (i16::from(rr), i16::from(gg), i16::from(bb), i16::from(d));
            let (for_r, for_g, for_b) = (gi - bi, bi - ri + 2 * di, ri - gi + 4 * di);
            hn[i] = if v == rr {
                for_r
            } else if v == gg {
                for_g
            } else {
                for_b
            };
            (vv[i], dd[i]) = (v, d);
        }
        // The two divisions (rounded single-precision quotients: the tables' entries, tested for every byte),
        // then the table reads, three per pixel, each by a byte. (Computing `val` or `sat_f` in arithmetic
        // instead, or merging the next two loops, measured slower.)
        let (mut ss, mut hh) = ([0u8; RUN], [0u8; RUN]);
        for i in 0..RUN {
            let sdiv = div_round(SDIV_NUM, vv[i]);
            let hdiv = div_round(HDIV_NUM, dd[i]);
            let s = (i32::from(dd[i]) * sdiv + HSV_ROUND) >> HSV_SHIFT;
            let mut h = (i32::from(hn[i]) * hdiv + HSV_ROUND) >> HSV_SHIFT;
            if h < 0 {
                h += HUE_RANGE;
            }
            (ss[i], hh[i]) = (s as u8, h as u8);
        }
        let (mut val, mut hue) = ([0u8; RUN], [0u8; RUN]);
        for i in 0..RUN {
            let (v, s, h) = (usize::from(vv[i]), usize::from(ss[i]), usize::from(hh[i]));
            (val[i], sf[i], hue[i]) = (self.val[v], self.sat_f[s], self.hue[h]);
        }
        for i in 0..RUN {
            vf[i] = f32::from(val[i]) * INV255;
            (sec[i], hg[i]) = hue_factor(hue[i]);
        }
        for i in 0..RUN {
            p8[i] = to_u8(vf[i] * (1.0 - sf[i]));
            t8[i] = to_u8(vf[i] * (1.0 - sf[i] * hg[i]));
        }
        // OpenCV's `sector_data` per channel: r is v in sectors 0 and 5, p in 2 and 3, the third value in 1
        // and 4; g is v in 1, 2, p in 4, 5; b is v in 3, 4, p in 0, 1 (`PERM`).
        for i in 0..RUN {
            // `v`'s rounding `to_u8(val / 255)` is `val` itself (tested).
            let (k, v, p, t) = (sec[i], val[i], p8[i], t8[i]);
            let pick = |is_v: bool, is_p: bool| {
                if is_v {
                    v
                } else if is_p {
                    p
                } else {
                    t
                }
            };
            r[i] = pick((k == 0) | (k == 5), (k == 2) | (k == 3));
            g[i] = pick((k == 1) | (k == 2), (k == 4) | (k == 5));
            b[i] = pick((k == 3) | (k == 4), (k == 0) | (k == 1));
        }
    }

    /// Applies the augmentation to one RGB pixel.
    #[inline(always)]
    pub fn apply(&self, rgb: [u8; 3]) -> [u8; 3] {
        let (h, s, v) = rgb_to_hsv(rgb, &SDIV, &HDIV);
        let (h, s, v) = (h as usize, s as usize, v as usize);
        let (sf, vf) = (self.sat_f[s], self.val_f[v]);
        // `sector_to_rgb`'s `p` and `q` or `t`; at s = 0 they equal v exactly, as its grey branch gives.
        let p = to_u8(vf * (1.0 - sf));
        let third = to_u8(vf * (1.0 - sf * self.hue_g[h]));
        let packed = u32::from(self.val[v]) | u32::from(p) << 8 | u32::from(third) << 16;
        let sh = self.hue_shifts[h];
        [(packed >> (sh & 31)) as u8, (packed >> ((sh >> 8) & 31)) as u8, (packed >> ((sh >> 16) & 31)) as u8]
    }
}

/// OpenCV's 8-bit RGB → HSV (`H` in 0..180), given its division tables.
#[inline(always)]
fn rgb_to_hsv(rgb: [u8; 3], sdiv: &[i32; 256], hdiv: &[i32; 256]) -> (u8, u8, u8) {
    let (r, g, b) = (i32::from(rgb[0]), i32::from(rgb[1]), i32::from(rgb[2]));
    let v = r.max(g).max(b);
    let diff = v - r.min(g).min(b);
    let s = (diff * sdiv[v as usize] + HSV_ROUND) >> HSV_SHIFT;
    let hnum = if v == r {
        g - b
    } else if v == g {
        b - r + 2 * diff
    } else {
        r - g + 4 * diff
    };
    let mut h = (hnum * hdiv[diff as usize] + HSV_ROUND) >> HSV_SHIFT;
    if h < 0 {
        h += HUE_RANGE;
    }
    (h as u8, s as u8, v as u8)
}

/// OpenCV's 8-bit HSV → RGB from the hue's sector and fraction and `s, v` in `[0, 1]`: `tab = [v, v(1 - s),
/// v(1 - s f), v(1 - s(1 - f))]` distributed over (r, g, b) by sector (OpenCV's `sector_data`), then
/// `saturate_cast<uchar>(x * 255)` (round half to even).
#[inline(always)]
fn sector_to_rgb(sector: u8, f: f32, s: f32, v: f32) -> [u8; 3] {
    let (r, g, b) = if s == 0.0 {
        (v, v, v)
    } else {
        // Indexed selection instead of a `match`: the sector changes from pixel to pixel and a branch on it
        // mispredicts.
        let tab = [v, v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f))];
        let idx = PERM[usize::from(sector.min(5))];
        (tab[usize::from(idx[0] & 3)], tab[usize::from(idx[1] & 3)], tab[usize::from(idx[2] & 3)])
    };
    [to_u8(r), to_u8(g), to_u8(b)]
}

/// OpenCV's `sector_data` permutation, as (r, g, b) indices into `tab = [v, p, q, t]`.
const PERM: [[u8; 3]; 6] = [[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]];

/// `saturate_cast<uchar>(x * 255)` (round half to even).
#[inline(always)]
fn to_u8(x: f32) -> u8 {
    // Clamped first, then rounded by adding 2^23 (float spacing 1 there, the FPU's default rounding is half to
    // even; rounding commutes with a clamp to integer bounds), and `as u8` for that integer in [0, 255] is the
    // sum's low bits (x is finite here): a conversion that vectorises where the saturating one does not.
    ((x * 255.0).clamp(0.0, 255.0) + 8_388_608.0).to_bits() as u8
}

/// OpenCV's 8-bit HSV → RGB.
fn hsv_to_rgb(h: u8, s: u8, v: u8) -> [u8; 3] {
    let (sector, f) = sector_of(h);
    sector_to_rgb(sector, f, f32::from(s) * INV255, f32::from(v) * INV255)
}

/// The per-pixel formula, without lookup tables: OpenCV's RGB → HSV with its divisions evaluated in place,
/// Ultralytics' gain expressions evaluated for this pixel's H, S and V, OpenCV's HSV → RGB. Equal to
/// [`HsvLut::apply`] for every pixel (tested); kept as the specification and the test oracle.
pub fn hsv_reference(rgb: [u8; 3], gains: HsvGains) -> [u8; 3] {
    let (r, g, b) = (i32::from(rgb[0]), i32::from(rgb[1]), i32::from(rgb[2]));
    let v = r.max(g).max(b);
    let diff = v - r.min(g).min(b);
    // saturate_cast<int>((255 << 12) / (1. * v)) and ((180 << 12) / (6. * diff)): cvRound.
    let sdiv = if v == 0 { 0 } else { (f64::from(255 << HSV_SHIFT) / f64::from(v)).round_ties_even() as i32 };
    let hdiv =
        if diff == 0 { 0 } else { (f64::from(180 << HSV_SHIFT) / (6.0 * f64::from(diff))).round_ties_even() as i32 };
    let s = (diff * sdiv + HSV_ROUND) >> HSV_SHIFT;
    let hnum = if v == r {
        g - b
    } else if v == g {
        b - r + 2 * diff
    } else {
        r - g + 4 * diff
    };
    let mut h = (hnum * hdiv + HSV_ROUND) >> HSV_SHIFT;
    if h < 0 {
        h += HUE_RANGE;
    }
    let h2 = hue_entry(f64::from(h), gains.h * 180.0);
    let s2 = if s == 0 { 0 } else { gain_entry(f64::from(s), gains.s + 1.0) };
    let v2 = gain_entry(f64::from(v), gains.v + 1.0);
    hsv_to_rgb(h2, s2, v2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_pixel(step: usize) -> impl Iterator<Item = [u8; 3]> {
        (0..256usize).step_by(step).flat_map(move |r| {
            (0..256usize).step_by(step).flat_map(move |g| (0..256usize).map(move |b| [r as u8, g as u8, b as u8]))
        })
    }

    #[test]
    fn lut_equals_per_pixel_formula() {
        let cases = [
            HsvGains { h: 0.0, s: 0.0, v: 0.0 },
            HsvGains { h: 0.015, s: 0.7, v: 0.4 },
            HsvGains { h: -0.015, s: -0.7, v: -0.4 },
            HsvGains { h: 0.0071, s: -0.23, v: 0.31 },
            HsvGains { h: -0.5, s: 0.99, v: -0.99 },
        ];
        for gains in cases {
            let lut = HsvLut::new(gains);
            // Every blue level, red and green in steps of 3 (1.4M pixels per case): all the table and sector
            // paths are hit.
            for px in every_pixel(3) {
                assert_eq!(lut.apply(px), hsv_reference(px, gains), "pixel {px:?} gains {gains:?}");
            }
        }
    }

    /// `saturate_cast<uchar>(x * 255)` by its definition.
    fn saturate_cast(x: f32) -> u8 {
        (x * 255.0).round_ties_even().clamp(0.0, 255.0) as u8
    }

    #[test]
    fn to_u8_is_saturate_cast() {
        for i in -4096..=(1 << 20) {
            let x = i as f32 / (1 << 19) as f32 - 0.001; // [-0.009, 2]: every rounding of [0, 1] and beyond
            assert_eq!(to_u8(x), saturate_cast(x), "{x}");
        }
        // Every float within 64 ulps of each rounding boundary `(k + 1/2) / 255` and of each `k / 255`.
        for k in 0..=256 {
            for c in [(k as f32 - 0.5) / 255.0, k as f32 / 255.0] {
                for d in -64..=64 {
                    // (Stepping below 0.0's bits wraps to NaNs: not inputs, skipped.)
                    let x = f32::from_bits(c.to_bits().wrapping_add_signed(d));
                    if x.is_finite() {
                        assert_eq!(to_u8(x), saturate_cast(x), "{x}");
                    }
                }
            }
        }
        for x in [0.0, -0.0, -1.0, 1.0, 3.0, 1e30, -1e30, f32::MIN_POSITIVE, -f32::MIN_POSITIVE] {
            assert_eq!(to_u8(x), saturate_cast(x), "{x}");
        }
    }

    #[test]
    fn value_rounding_is_the_value() {
        for v in 0..=255u8 {
            assert_eq!(to_u8(f32::from(v) * INV255), v);
        }
    }

    /// Every 24-bit colour through `apply_planes` in `run`'s build (the baseline one, or the AVX2 one the fused
    /// sampler runs), against `apply`.
    fn check_planes_on_every_colour(run: impl Fn(&HsvLut, &mut [u8], &mut [u8], &mut [u8]), build: &str) {
        let gains = [
            HsvGains { h: 0.015, s: 0.7, v: 0.4 },
            HsvGains { h: -0.3, s: -0.7, v: -0.4 },
            HsvGains { h: 0.0, s: 0.0, v: 0.0 },
            HsvGains { h: 0.5, s: 0.99, v: -0.99 },
        ];
        for g in gains {
            let lut = HsvLut::new(g);
            let px: Vec<[u8; 3]> = every_pixel(1).collect();
            let mut planes: [Vec<u8>; 3] = std::array::from_fn(|c| px.iter().map(|p| p[c]).collect());
            let [r, gg, b] = &mut planes;
            run(&lut, r, gg, b);
            for (i, p) in px.iter().enumerate() {
                assert_eq!([r[i], gg[i], b[i]], lut.apply(*p), "pixel {p:?} gains {g:?} ({build} build)");
            }
        }
    }

    #[test]
    fn planes_equal_per_pixel() {
        check_planes_on_every_colour(HsvLut::apply_planes, "baseline");
    }

    /// `apply_planes` inlined into an AVX2 function, as the fused sampler's row path runs it.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn apply_planes_avx2(lut: &HsvLut, r: &mut [u8], g: &mut [u8], b: &mut [u8]) {
        lut.apply_planes(r, g, b);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn planes_equal_per_pixel_avx2() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        check_planes_on_every_colour(|lut, r, g, b| unsafe { apply_planes_avx2(lut, r, g, b) }, "AVX2");
    }

    #[test]
    fn planes_of_any_length() {
        let lut = HsvLut::new(HsvGains { h: 0.015, s: 0.7, v: 0.4 });
        let px: Vec<[u8; 3]> = every_pixel(1).step_by(40_009).take(300).collect();
        for len in 0..px.len() {
            let mut planes: [Vec<u8>; 3] = std::array::from_fn(|c| px[..len].iter().map(|p| p[c]).collect());
            // A longer row than the others: only the common length is mapped.
            planes[1].push(7);
            let [r, g, b] = &mut planes;
            lut.apply_planes(r, g, b);
            for (i, p) in px[..len].iter().enumerate() {
                assert_eq!([r[i], g[i], b[i]], lut.apply(*p), "pixel {i} of {len}");
            }
            assert_eq!(g[len], 7, "past the common length");
        }
    }

    #[test]
    fn hue_factor_is_sector_of() {
        for h in 0..=255u8 {
            let (sector, f) = sector_of(h);
            let sector = sector.min(5);
            let g = if sector % 2 == 1 { f } else { 1.0 - f };
            let (k, gk) = hue_factor(h);
            assert_eq!((k, gk.to_bits()), (sector, g.to_bits()), "hue {h}");
        }
    }

    #[test]
    fn divisions_equal_tables() {
        for x in 0..=255u8 {
            assert_eq!(div_round(SDIV_NUM, x), SDIV[usize::from(x)], "sdiv {x}");
            assert_eq!(div_round(HDIV_NUM, x), HDIV[usize::from(x)], "hdiv {x}");
        }
    }

    #[test]
    fn division_tables_match_opencv_definition() {
        for i in 1..256 {
            assert_eq!(SDIV[i], (f64::from(255 << 12) / i as f64).round() as i32);
            assert_eq!(HDIV[i], (f64::from(180 << 12) / (6.0 * i as f64)).round() as i32);
        }
    }

    #[test]
    fn known_conversions() {
        assert_eq!(rgb_to_hsv([255, 0, 0], &SDIV, &HDIV), (0, 255, 255));
        assert_eq!(rgb_to_hsv([0, 255, 0], &SDIV, &HDIV), (60, 255, 255));
        assert_eq!(rgb_to_hsv([0, 0, 255], &SDIV, &HDIV), (120, 255, 255));
        assert_eq!(rgb_to_hsv([114, 114, 114], &SDIV, &HDIV), (0, 0, 114));
        assert_eq!(hsv_to_rgb(0, 255, 255), [255, 0, 0]);
        assert_eq!(hsv_to_rgb(60, 255, 255), [0, 255, 0]);
        assert_eq!(hsv_to_rgb(120, 255, 255), [0, 0, 255]);
        // Value gain -0.5 halves a grey; a hue shift of +60 units (1/3 turn) turns red into green.
        assert_eq!(HsvLut::new(HsvGains { h: 0.0, s: 0.0, v: -0.5 }).apply([114, 114, 114]), [57, 57, 57]);
        assert_eq!(HsvLut::new(HsvGains { h: 1.0 / 3.0, s: 0.0, v: 0.0 }).apply([255, 0, 0]), [0, 255, 0]);
    }

    #[test]
    fn zero_gains_round_trip_closely() {
        let lut = HsvLut::new(HsvGains { h: 0.0, s: 0.0, v: 0.0 });
        let mut worst = 0;
        for px in every_pixel(5) {
            let out = lut.apply(px);
            for c in 0..3 {
                worst = worst.max((i32::from(out[c]) - i32::from(px[c])).abs());
            }
        }
        // OpenCV's 8-bit HSV quantises hue to 2-degree steps: at full saturation half a step is 255/60 levels of
        // the middle channel, plus the saturation's rounding (the worst case here is 5).
        assert!(worst <= 5, "round trip moved a channel by {worst}");
    }
}
