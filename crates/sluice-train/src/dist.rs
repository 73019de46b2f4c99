//! The data-parallel side of a run: which rank this process is and the engine that joins the ranks ([`Dist`]),
//! the gradient combination at each optimizer step ([`HostGradReduce`]), and the collectives the trainer needs
//! around it (weights from rank 0, the metric state of a sharded validation, agreeing to stop).
//!
//! As Ultralytics' DDP: `batch` is the global batch, split evenly across the ranks; the optimizer's nominal-batch
//! accumulation and weight decay follow the global batch; each rank's loss is its own batch's, and the ranks'
//! gradients are summed (DDP averages gradients of `loss · world_size`, which is the same sum); BatchNorm's running
//! statistics stay per rank (Ultralytics turns DDP's buffer broadcast off), and rank 0's model is the one that is
//! validated and saved, so its EMA is sent to the other ranks before each sharded validation.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use sluice_dist::{Collective, DistError, Launch, Progress, Rendezvous, Solo};

use crate::error::{Context, Result};
use crate::optim::{GradReduce, OptimError, groups::Param};

/// The ranks of a run and the engine that joins them.
pub struct Dist {
    comm: Arc<dyn Collective>,
    launch: Launch,
    /// The TCP connections to the other ranks, with the heartbeat that notices a lost one.
    rendezvous: Option<Rendezvous>,
    /// The count of collectives entered, which the heartbeat's stall watchdog compares across the ranks.
    progress: Progress,
    /// The device the engine works on (the trainer uses this one, so that NCCL and the model share a stream).
    device: Option<Device>,
    /// The NCCL engine again, for the gradient sum on the device.
    #[cfg(feature = "nccl")]
    nccl: Option<Arc<sluice_dist::Nccl>>,
}

impl std::fmt::Debug for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dist").field("engine", &self.comm.name()).field("launch", &self.launch).finish()
    }
}

impl Default for Dist {
    fn default() -> Self {
        Self::single()
    }
}

impl Dist {
    /// One process, one rank.
    pub fn single() -> Self {
        Self {
            comm: Arc::new(Solo),
            launch: Launch::single(),
            rendezvous: None,
            progress: Progress::default(),
            device: None,
            #[cfg(feature = "nccl")]
            nccl: None,
        }
    }

    /// The ranks as the launcher's variables describe them, read through `vars` (the binary passes the process
    /// environment: torchrun or Sluice's launcher, `mpirun`, `srun`; one rank when none of them started the
    /// process), joined by the engine for `device`: MPI for CPU ranks (feature `mpi`, started by `mpirun`), NCCL for
    /// CUDA ranks (feature `nccl`). The ranks first meet over TCP at rank 0's address (`MASTER_ADDR:MASTER_PORT`;
    /// under `mpirun` without them, rank 0 picks a port and MPI carries it), which carries NCCL's id and then the
    /// heartbeat; `vars` also gives the rendezvous's timeouts ([`sluice_dist::RendezvousConfig::with_vars`]).
    pub fn from_vars(device: &Device, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let launch = Launch::from_vars(vars)?;
        // A launcher's single rank still goes through the engine (one NCCL rank checks the GPU path end to end).
        if launch.launcher == sluice_dist::Launcher::Single {
            return Ok(Self::single());
        }
        let mut d = if device.is_cuda() { Self::nccl(launch, device, vars)? } else { Self::mpi(launch, vars)? };
        d.device = Some(device.clone());
        Ok(d)
    }

    /// The device [`Dist::from_vars`] joined the ranks on.
    pub fn device(&self) -> Option<&Device> {
        self.device.as_ref()
    }

    #[cfg(feature = "mpi")]
    fn mpi(launch: Launch, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        use sluice_dist::Mpi;
        let mpi = Mpi::init()?;
        crate::ensure!(
            launch.launcher == sluice_dist::Launcher::Mpi,
            "CPU ranks meet through MPI: start them with `sluice train --device cpu --nproc N` or `mpirun`, not {}",
            launch.launcher.name()
        );
        let (addr, listener) = match &launch.master {
            Some(m) => (m.clone(), None),
            None => {
                // Ranks on one node meet on the loopback; across nodes rank 0 listens everywhere and names its host.
                let one_node = launch.local_world == Some(launch.world);
                let (bind, host) =
                    if one_node { ("127.0.0.1", "127.0.0.1".to_string()) } else { ("0.0.0.0", mpi.processor_name()?) };
                let listener = if mpi.rank() == 0 { Some(Rendezvous::bind(&format!("{bind}:0"))?) } else { None };
                let mut addr = match &listener {
                    Some(l) => format!("{host}:{}", l.local_addr().map(|a| a.port()).unwrap_or(0)).into_bytes(),
                    None => Vec::new(),
                };
                mpi.broadcast_bytes(&mut addr, 0)?;
                (String::from_utf8_lossy(&addr).into_owned(), listener)
            }
        };
        let cfg = sluice_dist::RendezvousConfig::new(addr, launch.rank, launch.world).with_vars(vars)?;
        let (rendezvous, _) = Rendezvous::join(&cfg, listener, &[])?;
        let mut d = Self::new(Arc::new(mpi), launch)?;
        d.progress = rendezvous.progress();
        d.rendezvous = Some(rendezvous);
        Ok(d)
    }

    #[cfg(not(feature = "mpi"))]
    fn mpi(launch: Launch, _vars: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        Err(DistError::NotBuilt {
            what: format!("training on {} CPU ranks", launch.world),
            feature: "mpi",
            hint: "cargo build --release --features mpi, with an MPI library: Debian's libopenmpi-dev",
        }
        .into())
    }

    #[cfg(feature = "nccl")]
    fn nccl(launch: Launch, device: &Device, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let addr = launch.master.clone().ok_or_else(|| DistError::Env {
            var: "MASTER_ADDR".into(),
            reason: format!("not set: GPU ranks started by {} meet at rank 0's address", launch.launcher.name()),
        })?;
        let id = if launch.rank == 0 { sluice_dist::nccl::unique_id()?.to_vec() } else { Vec::new() };
        let cfg = sluice_dist::RendezvousConfig::new(addr, launch.rank, launch.world).with_vars(vars)?;
        let (rendezvous, id) = Rendezvous::join(&cfg, None, &id)?;
        let nccl = Arc::new(sluice_dist::Nccl::new(device, launch.rank, launch.world, &id)?);
        let mut d = Self::new(Arc::clone(&nccl) as Arc<dyn Collective>, launch)?;
        d.progress = rendezvous.progress();
        d.rendezvous = Some(rendezvous);
        d.nccl = Some(nccl);
        Ok(d)
    }

    #[cfg(not(feature = "nccl"))]
    fn nccl(launch: Launch, _device: &Device, _vars: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        Err(DistError::NotBuilt {
            what: format!("training on {} GPU ranks", launch.world),
            feature: "nccl",
            hint: "cargo build --release --features cuda,nccl, with NCCL's library on the library path",
        }
        .into())
    }

    /// Runs `f` once, on the heartbeat's thread, when another rank is lost. A rank blocked inside a collective
    /// cannot return an error by itself, so the `sluice` binary prints the error there and ends the process.
    pub fn on_lost(&self, f: Box<dyn FnOnce(&DistError) + Send>) {
        if let Some(r) = &self.rendezvous {
            r.on_lost(f);
        }
    }

    /// The first lost rank, or NCCL's asynchronous error, as an error (checked between batches; both are host
    /// reads of a flag, no device wait).
    pub fn check(&self) -> Result<()> {
        if let Some(r) = &self.rendezvous {
            r.check()?;
        }
        #[cfg(feature = "nccl")]
        if let Some(n) = &self.nccl {
            n.check()?;
        }
        Ok(())
    }

    /// Ends the run's connections in order (the other ranks do not report this one as lost).
    pub fn finish(mut self) -> Result<()> {
        if let Some(r) = self.rendezvous.take() {
            r.finish()?;
        }
        Ok(())
    }

    /// Ranks joined by `comm`, started as `launch` says (its rank and world must be the engine's).
    pub fn new(comm: Arc<dyn Collective>, launch: Launch) -> Result<Self> {
        crate::ensure!(
            comm.rank() == launch.rank && comm.world() == launch.world,
            "{}: the engine {} says rank {} of {}, the launcher rank {} of {}",
            launch.launcher.name(),
            comm.name(),
            comm.rank(),
            comm.world(),
            launch.rank,
            launch.world
        );
        Ok(Self {
            comm,
            launch,
            rendezvous: None,
            progress: Progress::default(),
            device: None,
            #[cfg(feature = "nccl")]
            nccl: None,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// Whether this is rank 0 (it writes logs, results, plots and checkpoints).
    pub fn is_main(&self) -> bool {
        self.comm.is_main()
    }

    /// Whether the run has more than one rank.
    pub fn is_distributed(&self) -> bool {
        self.world() > 1
    }

    /// How this process was started.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// The engine.
    pub fn comm(&self) -> &Arc<dyn Collective> {
        &self.comm
    }

    /// The gradient combination for the optimizer: on the device through NCCL where it joins the ranks, else
    /// through the engine's host all-reduce.
    pub fn grad_reduce(&self) -> Box<dyn GradReduce> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.nccl {
            return Box::new(DeviceGradReduce { nccl: Arc::clone(nccl), progress: self.progress.clone() });
        }
        Box::new(HostGradReduce { comm: Arc::clone(&self.comm), bucket: Vec::new(), progress: self.progress.clone() })
    }

    /// Sets every variable to rank 0's values (one broadcast of them all, flattened in the order given, which
    /// must be the same on every rank: sorted by name).
    pub fn broadcast_vars(&self, vars: &[(String, Var)]) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        self.progress.enter();
        let mut flat = Vec::new();
        for (name, v) in vars {
            let t = v.as_tensor().to_dtype(DType::F32)?.flatten_all()?;
            flat.extend(t.to_vec1::<f32>().with_context(|| format!("reading {name}"))?);
        }
        self.comm.broadcast(&mut flat, 0).context("broadcasting the weights from rank 0")?;
        let mut at = 0;
        for (name, v) in vars {
            let t = v.as_tensor();
            let n = t.elem_count();
            let part = flat.get(at..at + n).with_context(|| format!("{name}: the broadcast is short"))?;
            let value = Tensor::from_slice(part, t.shape(), t.device())?.to_dtype(t.dtype())?;
            v.set(&value).with_context(|| format!("setting {name}"))?;
            at += n;
        }
        Ok(())
    }

    /// Whether `flag` is set on any rank (the ranks agree to stop at the same batch).
    pub fn any(&self, flag: bool) -> Result<bool> {
        if !self.is_distributed() {
            return Ok(flag);
        }
        let mut v = [f32::from(u8::from(flag))];
        self.progress.enter();
        self.comm.all_reduce_sum(&mut v).context("agreeing to stop")?;
        Ok(v[0] > 0.0)
    }

    /// Sums `values` over the ranks in rank order, in f64 (every rank gets the same result).
    pub fn sum_f64(&self, values: &mut [f64]) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.progress.enter();
        let parts = self.comm.all_gather_bytes(&mine).context("gathering sums")?;
        values.iter_mut().for_each(|v| *v = 0.0);
        for (rank, part) in parts.iter().enumerate() {
            crate::ensure!(
                part.len() == mine.len(),
                "rank {rank} sent {} bytes of sums, not {}",
                part.len(),
                mine.len()
            );
            for (v, b) in values.iter_mut().zip(part.chunks_exact(8)) {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                *v += f64::from_le_bytes(a);
            }
        }
        Ok(())
    }

    /// Every rank's `mine`, in rank order.
    pub fn gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.progress.enter();
        Ok(self.comm.all_gather_bytes(mine)?)
    }

    /// Waits for every rank.
    pub fn barrier(&self) -> Result<()> {
        self.progress.enter();
        Ok(self.comm.barrier()?)
    }
}

/// Validation shares its batches among the ranks through the same collectives.
impl sluice_infer::Ranks for Dist {
    fn is_distributed(&self) -> bool {
        Dist::is_distributed(self)
    }

    fn gather_bytes(&self, mine: &[u8]) -> std::result::Result<Vec<Vec<u8>>, sluice_infer::validate::BoxError> {
        Ok(Dist::gather_bytes(self, mine)?)
    }

    fn sum_f64(&self, values: &mut [f64]) -> std::result::Result<(), sluice_infer::validate::BoxError> {
        Ok(Dist::sum_f64(self, values)?)
    }
}

/// Every variable of `model` (parameters and BatchNorm statistics), sorted by name: the same order on every rank.
pub fn all_vars(model: &sluice_model::Yolo) -> Vec<(String, Var)> {
    // A poisoned lock means another thread panicked while holding it; the map itself is intact.
    let data = model.varmap().data().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut v: Vec<_> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Sums the ranks' gradients through the engine's host all-reduce: the gradients are copied into one flat
/// buffer (kept between steps), reduced in one call and rebuilt as tensors. A parameter without a gradient
/// contributes zeros, so every rank's buffer has the same layout.
pub struct HostGradReduce {
    comm: Arc<dyn Collective>,
    bucket: Vec<f32>,
    progress: Progress,
}

impl std::fmt::Debug for HostGradReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGradReduce").field("engine", &self.comm.name()).finish()
    }
}

impl GradReduce for HostGradReduce {
    fn reduce(&mut self, grads: &mut [Option<Tensor>], params: &[Param]) -> crate::optim::Result<()> {
        if self.comm.world() < 2 {
            return Ok(());
        }
        self.bucket.clear();
        for (g, p) in grads.iter().zip(params) {
            match g {
                Some(g) => {
                    let g = g.to_dtype(DType::F32)?.contiguous()?;
                    if g.device().is_cpu() {
                        let (storage, layout) = g.storage_and_layout();
                        let candle_core::Storage::Cpu(cpu) = &*storage else {
                            return Err(bad(&p.name, "no CPU storage"));
                        };
                        let (a, b) = layout.contiguous_offsets().ok_or_else(|| bad(&p.name, "not contiguous"))?;
                        self.bucket.extend_from_slice(&cpu.as_slice::<f32>()?[a..b]);
                    } else {
                        sluice_core::syncs::record(sluice_core::syncs::Site::GradReduce);
                        self.bucket.extend(g.flatten_all()?.to_vec1::<f32>()?);
                    }
                }
                None => self.bucket.resize(self.bucket.len() + p.var.as_tensor().elem_count(), 0.0),
            }
        }
        self.progress.enter();
        self.comm
            .all_reduce_sum(&mut self.bucket)
            .map_err(|e| OptimError::BadInput(format!("all-reducing the gradients: {e}")))?;
        let mut at = 0;
        for (g, p) in grads.iter_mut().zip(params) {
            let t = p.var.as_tensor();
            let n = t.elem_count();
            let part = self.bucket.get(at..at + n).ok_or_else(|| bad(&p.name, "the reduced buffer is short"))?;
            *g = Some(Tensor::from_slice(part, t.shape(), t.device())?.to_dtype(t.dtype())?);
            at += n;
        }
        Ok(())
    }
}

fn bad(name: &str, why: &str) -> OptimError {
    OptimError::BadInput(format!("gradient of {name}: {why}"))
}

/// Sums the ranks' gradients on the device: one concatenated bucket per step, reduced in place by NCCL on the
/// compute stream (ordered after the backward, with no host wait) and cut back into the parameters' shapes.
#[cfg(feature = "nccl")]
#[derive(Debug)]
pub struct DeviceGradReduce {
    nccl: Arc<sluice_dist::Nccl>,
    progress: Progress,
}

#[cfg(feature = "nccl")]
impl GradReduce for DeviceGradReduce {
    fn reduce(&mut self, grads: &mut [Option<Tensor>], params: &[Param]) -> crate::optim::Result<()> {
        let mut flat = Vec::with_capacity(grads.len());
        for (g, p) in grads.iter().zip(params) {
            let t = p.var.as_tensor();
            flat.push(match g {
                Some(g) => g.to_dtype(DType::F32)?.flatten_all()?,
                None => Tensor::zeros(t.elem_count(), DType::F32, t.device())?,
            });
        }
        // A fresh tensor that nothing else holds, so reducing it in place is safe.
        let bucket = Tensor::cat(&flat, 0)?;
        drop(flat);
        self.progress.enter();
        self.nccl
            .all_reduce_sum_tensor(&bucket)
            .map_err(|e| OptimError::BadInput(format!("all-reducing the gradients: {e}")))?;
        let mut at = 0;
        for (g, p) in grads.iter_mut().zip(params) {
            let t = p.var.as_tensor();
            let n = t.elem_count();
            *g = Some(bucket.narrow(0, at, n)?.reshape(t.shape())?.to_dtype(t.dtype())?);
            at += n;
        }
        Ok(())
    }
}
