//! NumPy's float64 arithmetic where the reference numbers depend on it: `linspace`, pairwise summation (what
//! `np.sum` / `np.mean` do on a contiguous array), `np.interp` and `np.trapezoid`. Ported operation for
//! operation so that COCO and Ultralytics metrics come out equal to the references, not merely close.

/// `np.linspace(start, stop, num)` (endpoint included): `i * step + start`, the last value set to `stop`.
pub fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 0 {
        return Vec::new();
    }
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut y: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    y[num - 1] = stop;
    y
}

/// NumPy's pairwise sum of a float64 sequence (`pairwise_sum_DOUBLE`: blocks of up to 128 summed with 8
/// accumulators, larger inputs split in halves).
pub fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &v in a {
            res += v;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// `np.mean` of a float64 sequence: the pairwise sum divided by the count (NaN for an empty input).
pub fn mean(a: &[f64]) -> f64 {
    // NumPy adds the reduction's identity (0.0) first.
    (0.0 + pairwise_sum(a)) / a.len() as f64
}

/// `np.interp(x, xp, fp, left, right)` for one `x`; `xp` must be non-decreasing. `left`/`right` default to
/// `fp[0]` / `fp[last]` as in NumPy when `None`.
pub fn interp1(x: f64, xp: &[f64], fp: &[f64], left: Option<f64>, right: Option<f64>) -> f64 {
    let n = xp.len();
    debug_assert_eq!(n, fp.len());
    if n == 0 {
        return f64::NAN;
    }
    let lval = left.unwrap_or(fp[0]);
    let rval = right.unwrap_or(fp[n - 1]);
    if x.is_nan() {
        return x;
    }
    if n == 1 {
        return if x < xp[0] {
            lval
        } else if x > xp[0] {
            rval
        } else {
            fp[0]
        };
    }
    if x > xp[n - 1] {
        return rval;
    }
    if x < xp[0] {
        return lval;
    }
    // The j with xp[j] <= x < xp[j + 1] (the last index whose value is <= x).
    let j = xp.partition_point(|&v| v <= x) - 1;
    if j == n - 1 || xp[j] == x {
        return fp[j];
    }
    let slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    let mut res = slope * (x - xp[j]) + fp[j];
    if res.is_nan() {
        res = slope * (x - xp[j + 1]) + fp[j + 1];
        if res.is_nan() && fp[j] == fp[j + 1] {
            res = fp[j];
        }
    }
    res
}

/// `np.trapezoid(y, x)`: pairwise sum of `(x[i+1] - x[i]) * (y[i+1] + y[i]) / 2`.
pub fn trapezoid(y: &[f64], x: &[f64]) -> f64 {
    let terms: Vec<f64> = (0..y.len().saturating_sub(1)).map(|i| (x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2.0).collect();
    0.0 + pairwise_sum(&terms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_matches_numpy_values() {
        // np.linspace(.5, 0.95, 10) as pycocotools builds its IoU thresholds (values printed by NumPy).
        let t = linspace(0.5, 0.95, 10);
        assert_eq!(t[5], 0.75);
        assert_eq!(t[8], 0.8999999999999999);
        assert_eq!(t[9], 0.95);
        let r = linspace(0.0, 1.0, 101);
        assert_eq!((r[0], r[100], r.len()), (0.0, 1.0, 101));
        assert_eq!(r[7], 0.07);
    }

    #[test]
    fn pairwise_sum_is_exact_on_integers_and_orders_like_numpy() {
        let a: Vec<f64> = (0..1000).map(f64::from).collect();
        assert_eq!(pairwise_sum(&a), 499_500.0);
        // 1e16 + 1 + 1 ... : naive left-to-right loses the ones, blocked accumulation keeps some of them.
        let mut b = vec![1.0; 16];
        b[0] = 1e16;
        let naive = b.iter().fold(0.0, |s, v| s + v);
        assert_eq!(naive, 1e16);
        // r[0] = 1e16 + 1 (lost), r[1..8] = 2 each -> 1e16 + 14.
        assert_eq!(pairwise_sum(&b), 1e16 + 14.0);
        assert_eq!(mean(&[1.0, 2.0, 4.0]), 7.0 / 3.0);
    }

    #[test]
    fn interp_follows_numpy_rules() {
        let xp = [0.0, 1.0, 2.0];
        let fp = [0.0, 10.0, 30.0];
        assert_eq!(interp1(0.5, &xp, &fp, None, None), 5.0);
        assert_eq!(interp1(1.5, &xp, &fp, None, None), 20.0);
        assert_eq!(interp1(2.0, &xp, &fp, None, None), 30.0);
        assert_eq!(interp1(-1.0, &xp, &fp, Some(-7.0), None), -7.0);
        assert_eq!(interp1(3.0, &xp, &fp, None, None), 30.0);
        assert_eq!(interp1(3.0, &[1.0], &[4.0], Some(0.0), Some(9.0)), 9.0);
        assert_eq!(interp1(1.0, &[1.0], &[4.0], Some(0.0), Some(9.0)), 4.0);
        // Duplicated xp: the last index whose value is <= x.
        assert_eq!(interp1(1.0, &[0.0, 1.0, 1.0, 2.0], &[0.0, 1.0, 5.0, 6.0], None, None), 5.0);
    }

    #[test]
    fn trapezoid_of_a_line() {
        let x = linspace(0.0, 1.0, 101);
        let y: Vec<f64> = x.iter().map(|v| 2.0 * v).collect();
        assert!((trapezoid(&y, &x) - 1.0).abs() < 1e-15);
    }
}
