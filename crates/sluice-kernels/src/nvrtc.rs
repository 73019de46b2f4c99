//! CUDA C sources compiled by NVRTC once per device (feature `cuda`). Every kernel source of the workspace is
//! compiled, loaded and looked up through [`PerDevice::get`], which keeps one set of a source's functions per
//! device for the life of the process, so a source costs one NVRTC compile per device whoever asks for it (a
//! validation pass, a transfer ring, every optimizer step). `cargo xtask kernels` compiles the same sources with nvcc
//! ahead of time to check them without a GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use candle_core::cuda_backend::DeviceId;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule};
use candle_core::cuda_backend::cudarc::nvrtc::compile_ptx;
use candle_core::{CudaDevice, Error, Result};

/// The kernels `K` of one CUDA source, per device, made on first use.
pub struct PerDevice<K> {
    cache: OnceLock<Mutex<HashMap<DeviceId, Arc<K>>>>,
}

impl<K> std::fmt::Debug for PerDevice<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices = self.cache.get().map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).len());
        f.debug_struct("PerDevice").field("devices", &devices.unwrap_or(0)).finish()
    }
}

impl<K> Default for PerDevice<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> PerDevice<K> {
    /// An empty cache, for a `static`.
    pub const fn new() -> Self {
        Self { cache: OnceLock::new() }
    }

    /// The kernels of `src` on `dev`: on the first call for a device, `src` is compiled to PTX, loaded into the
    /// device's context and `load` takes its functions by name; later calls return the same kernels. `what` names
    /// the kernels in errors.
    pub fn get(
        &self,
        dev: &CudaDevice,
        what: &'static str,
        src: &str,
        load: impl FnOnce(&Functions<'_>) -> Result<K>,
    ) -> Result<Arc<K>> {
        let cache = self.cache.get_or_init(|| Mutex::new(HashMap::new()));
        // The map is only ever inserted into whole, so a panic elsewhere while it was held leaves it intact.
        let mut map = cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = map.get(&dev.id()) {
            return Ok(Arc::clone(k));
        }
        let ptx = compile_ptx(src).map_err(|e| Error::Msg(format!("{what}: compiling the kernels (NVRTC): {e}")))?;
        let module = (dev.cuda_stream().context().load_module(ptx))
            .map_err(|e| Error::Msg(format!("{what}: loading the kernels: {e:?}")))?;
        let k = Arc::new(load(&Functions { module, what })?);
        map.insert(dev.id(), Arc::clone(&k));
        Ok(k)
    }
}

/// The functions of a loaded module, for [`PerDevice::get`]'s `load`.
#[derive(Debug)]
pub struct Functions<'a> {
    module: Arc<CudaModule>,
    what: &'a str,
}

impl Functions<'_> {
    /// The kernel `name` (an `extern "C"` function of the source).
    pub fn get(&self, name: &str) -> Result<CudaFunction> {
        self.module.load_function(name).map_err(|e| Error::Msg(format!("{}: loading kernel {name}: {e:?}", self.what)))
    }
}
