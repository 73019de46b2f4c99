//! Device names as users write them (`cpu`, `cuda:N`, `N`, a list of GPUs for data-parallel training) and the
//! candle device one opens.

use sluice_model::candle_core::Device;

use crate::error::{InferError, Result};

fn bad(name: &str, reason: impl Into<String>) -> InferError {
    InferError::Device { name: name.to_string(), reason: reason.into() }
}

/// The devices a `device` setting names: `cpu`, `cuda:N`, or a list of GPUs for data-parallel training (`0,1,2,3`
/// or `cuda:0,cuda:1`), each as `cuda:N`.
pub fn device_list(name: &str) -> Result<Vec<String>> {
    if !name.contains(',') {
        return Ok(vec![name.trim().to_string()]);
    }
    name.split(',')
        .map(|d| {
            let d = d.trim();
            let ordinal = d.strip_prefix("cuda").map(|s| s.trim_start_matches(':')).unwrap_or(d);
            let n: usize = ordinal.parse().map_err(|_| bad(name, format!("{d:?} in the list is not a GPU")))?;
            Ok(format!("cuda:{n}"))
        })
        .collect()
}

/// The device of the rank with `local_rank` on its node: its entry of a device list, or the one device named.
pub fn rank_device(name: &str, local_rank: usize) -> Result<String> {
    let mut list = device_list(name)?;
    if list.len() == 1 {
        return Ok(list.swap_remove(0));
    }
    let n = list.len();
    list.into_iter()
        .nth(local_rank)
        .ok_or_else(|| bad(name, format!("the list has {n} devices; local rank {local_rank} has none")))
}

/// The device a name asks for: `cpu`, `cuda`, `cuda:N` or `N`. A CUDA device in a build without the `cuda` feature
/// is an error that says how to get one.
pub fn device_of(name: &str) -> Result<Device> {
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = name.strip_prefix("cuda").map(|s| s.trim_start_matches(':')).unwrap_or(name);
    let ordinal: usize = if ordinal.is_empty() {
        0
    } else {
        ordinal.parse().map_err(|_| bad(name, format!("device ordinal {ordinal:?} is not a number")))?
    };
    if !cfg!(feature = "cuda") {
        return Err(bad(
            name,
            "this sluice is built without CUDA; build it with `--features cuda` (`cargo xtask gpu-build`), or use \
             `--device cpu`",
        ));
    }
    let device =
        Device::new_cuda(ordinal).map_err(|e| bad(name, format!("this build has no CUDA support or no GPU: {e}")))?;
    // Freed tensors stay in the stream-ordered pool across synchronisations (a caching allocator), so steady-state
    // steps reserve no new device memory; the telemetry counts the steps that still did.
    sluice_transfer::retain_device_pool(&device).map_err(|e| bad(name, format!("memory pool: {e}")))?;
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranks() {
        assert_eq!(device_list("cpu").unwrap(), ["cpu"]);
        assert_eq!(device_list("0, cuda:3").unwrap(), ["cuda:0", "cuda:3"]);
        let e = device_list("0,gpu").unwrap_err().to_string();
        assert!(e.contains("device 0,gpu") && e.contains("\"gpu\""), "{e}");
        assert_eq!(rank_device("0,1", 1).unwrap(), "cuda:1");
        assert_eq!(rank_device("cuda:2", 5).unwrap(), "cuda:2");
        let e = rank_device("0,1", 2).unwrap_err().to_string();
        assert!(e.contains("2 devices; local rank 2 has none"), "{e}");
    }

    #[test]
    fn cpu_opens_and_a_bad_ordinal_is_named() {
        assert!(device_of("cpu").unwrap().is_cpu());
        let e = device_of("cuda:x").unwrap_err().to_string();
        assert!(e.contains("device cuda:x") && e.contains("\"x\""), "{e}");
    }
}
