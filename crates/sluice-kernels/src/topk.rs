//! The `k` largest values of each row of a tensor as tensor ops on the tensor's own device, past the column limit
//! of candle's CUDA argsort: the validation shrink and the end-to-end head's top-k both rank anchors this way, so
//! neither reads the head output on the host.

use candle_core::Tensor;

/// The most columns candle's CUDA `arg_sort_last_dim` handles: a one-block bitonic sort that holds the row, padded
/// to a power of two, as `u32` indices in 48 KB of shared memory.
pub const MAX_DEVICE_SORT: usize = 8192;

/// The `k` largest values of each row of a `(B, N)` tensor, in descending order, and their `u32` column indices,
/// as tensor ops on the tensor's device (no host read). Rows longer than [`MAX_DEVICE_SORT`] are cut into chunks: each
/// chunk's top `k` by one argsort, then the top `k` of the chunks' winners, recursively. Ties keep index order
/// where the argsort is stable (the CPU's); `k` must be at most `MAX_DEVICE_SORT / 2`.
pub fn topk_last(x: &Tensor, k: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let (_, n) = x.dims2()?;
    let k = k.min(n);
    if n <= MAX_DEVICE_SORT {
        let idx = x.contiguous()?.arg_sort_last_dim(false)?.narrow(1, 0, k)?.contiguous()?;
        let vals = x.contiguous()?.gather(&idx, 1)?;
        return Ok((vals, idx));
    }
    if 2 * k > MAX_DEVICE_SORT {
        candle_core::bail!(
            "top-{k} of {n} columns: k is limited to {} on rows longer than {MAX_DEVICE_SORT}",
            MAX_DEVICE_SORT / 2
        )
    }
    let (mut vals, mut idxs) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(MAX_DEVICE_SORT) {
        let len = MAX_DEVICE_SORT.min(n - start);
        let (v, i) = topk_last(&x.narrow(1, start, len)?, k)?;
        vals.push(v);
        idxs.push(i.broadcast_add(&Tensor::new(start as u32, x.device())?)?);
    }
    let (v, pos) = topk_last(&Tensor::cat(&vals, 1)?, k)?;
    let i = Tensor::cat(&idxs, 1)?.gather(&pos, 1)?;
    Ok((v, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn topk_last_equals_a_stable_host_sort_at_any_length() {
        for (n, k) in [(10, 20), (300, 300), (8192, 300), (8193, 300), (33_600, 300), (24_000, 4096)] {
            // Few distinct values: many exact ties.
            let v: Vec<f32> = (0..2 * n as u64).map(|i| ((i * 2_654_435_761 + n as u64) % 97) as f32).collect();
            let x = Tensor::from_vec(v.clone(), (2, n), &Device::Cpu).unwrap();
            let (vals, idx) = topk_last(&x, k).unwrap();
            let (vals, idx): (Vec<Vec<f32>>, Vec<Vec<u32>>) = (vals.to_vec2().unwrap(), idx.to_vec2().unwrap());
            for row in 0..2 {
                let r = &v[row * n..(row + 1) * n];
                let mut want: Vec<usize> = (0..n).collect();
                want.sort_by(|&a, &b| r[b].total_cmp(&r[a]).then(a.cmp(&b)));
                want.truncate(k.min(n));
                let got: Vec<usize> = idx[row].iter().map(|&i| i as usize).collect();
                assert_eq!(got, want, "n {n} k {k} row {row}");
                assert!(vals[row].iter().zip(&want).all(|(v, &i)| *v == r[i]));
            }
        }
        let x = Tensor::zeros((1, 20_000), DType::F32, &Device::Cpu).unwrap();
        assert!(topk_last(&x, 5000).is_err());
    }
}
