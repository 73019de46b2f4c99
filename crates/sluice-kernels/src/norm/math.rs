//! The element types of the fused CPU kernels (f32, f64) and the scalar functions their loops call: branch-free
//! Cephes polynomials for f32 `exp` and `ln` (so the loops vectorise), SiLU and its derivative.

use candle_core::WithDType;

/// The element types the CPU kernels support (f32 and f64), with the few functions they need.
pub(crate) trait Elem: WithDType {
    /// `e^x`; for f32 a branch-free polynomial that vectorises (within 2 ulp of `f32::exp`).
    fn exp_fast(self) -> Self;
    /// `ln x` for `x > 0`; for f32 a branch-free polynomial that vectorises (within 2 ulp of `f32::ln`).
    fn ln_fast(self) -> Self;
    /// Whether the value is NaN.
    fn nan(self) -> bool;
}

impl Elem for f32 {
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f32(self)
    }

    #[inline(always)]
    fn ln_fast(self) -> Self {
        ln_f32(self)
    }

    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Elem for f64 {
    #[inline(always)]
    fn exp_fast(self) -> Self {
        self.exp()
    }

    #[inline(always)]
    fn ln_fast(self) -> Self {
        self.ln()
    }

    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

/// Cephes' `expf`: `2^n · e^r` with `n = round(x·log2 e)`, `|r| ≤ ln2/2` and a degree-6 polynomial; no branches,
/// no libm call, so loops over it vectorise. The argument is clamped to [−87.3, 88.7]: below, the result is the
/// smallest normal float instead of a subnormal or 0; above, `+∞`.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer for |v| < 2^22.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.722_83);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r2 + r + 1.0;
    // 2^n through the exponent bits; n + 127 ∈ [1, 255] after the clamp (n = 128 gives +∞, as it should). `t`'s
    // bits are those of 1.5·2^23 plus n, so n comes out of them by integer arithmetic: `n as i32` (a saturating
    // cast) would not vectorise.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let bits = (ni.wrapping_add(127) as u32) << 23;
    e * f32::from_bits(bits)
}

/// Cephes' `logf` for positive normal `x`: `x = m·2^e` with `m ∈ [√½, √2)` from the bits, then
/// `ln m = (m − 1) − (m − 1)²/2 + (m − 1)³·P(m − 1)` with a degree-8 polynomial, plus `e·ln 2`; no branches.
#[inline(always)]
fn ln_f32(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    // Mantissa in [0.5, 1).
    let m = f32::from_bits((bits & 0x807f_ffff) | 0x3f00_0000);
    let small = m < SQRT_HALF;
    e -= i32::from(small);
    let r = if small { m + m - 1.0 } else { m - 1.0 };
    let ef = e as f32;
    let z = r * r;
    const P: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ];
    let p = P.iter().fold(0.0, |acc, &c| acc * r + c);
    let y = r * z * p - 2.121_944_4e-4 * ef - 0.5 * z;
    r + y + 0.693_359_4 * ef
}

/// `SiLU(z) = z·σ(z)`.
#[inline(always)]
pub(super) fn silu<T: Elem>(z: T) -> T {
    z / (T::one() + (T::zero() - z).exp_fast())
}

/// `SiLU'(z) = σ(z)·(1 + z·(1 − σ(z)))`.
#[inline(always)]
pub(super) fn silu_grad<T: Elem>(z: T) -> T {
    let s = T::one() / (T::one() + (T::zero() - z).exp_fast());
    s * (T::one() + z * (T::one() - s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_f32_matches_std() {
        let mut worst = 0f32;
        let mut x = 1e-30f32;
        while x < 1e30 {
            for v in [x, x * 1.37, x * 1.9999] {
                let (got, want) = (ln_f32(v), v.ln());
                worst = worst.max((got - want).abs() / want.abs().max(1e-6));
            }
            x *= 1.01;
        }
        for v in [1.0f32, 2.0, 0.5, std::f32::consts::SQRT_2, 1.0 + f32::EPSILON, 1.5] {
            assert!((ln_f32(v) - v.ln()).abs() <= 2.0 * f32::EPSILON * v.ln().abs().max(1.0), "{v}");
        }
        assert!(worst < 1e-6, "worst relative error {worst:e}");
    }

    #[test]
    fn exp_f32_matches_std_over_its_range() {
        let mut worst = 0f32;
        for i in -7_900..=8_000 {
            let x = i as f32 / 91.0;
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert!(exp_f32(-1000.0) < 1e-37);
        assert!(exp_f32(1000.0).is_infinite());
        // SiLU saturates cleanly at both ends.
        assert_eq!(silu(-200f32), -0.0);
        assert_eq!(silu(200f32), 200.0);
    }
}
