//! Which rank this process is, read from the environment of whatever started it: torchrun (and Sluice's own
//! launcher, which sets the same variables), `mpirun` (Open MPI's `OMPI_COMM_WORLD_*`) or Slurm's `srun`
//! (`SLURM_*` inside a job step). A process that none of them started is the one rank of a single-process run.

use crate::error::{DistError, Result};

/// The default rendezvous port (PyTorch's `MASTER_PORT` default).
pub const DEFAULT_PORT: u16 = 29500;

/// What started the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Nothing: one process, one rank.
    Single,
    /// torchrun (`--no-python`) or Sluice's own launcher: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT`.
    Torchrun,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    Mpi,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, `SLURM_STEP_NUM_NODES`.
    Slurm,
}

impl Launcher {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Single => "single process",
            Self::Torchrun => "torchrun",
            Self::Mpi => "mpirun",
            Self::Slurm => "srun",
        }
    }
}

/// This process's place in the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// What started it.
    pub launcher: Launcher,
    /// Global rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank on this node (picks the GPU and the node's cache builder).
    pub local_rank: usize,
    /// Ranks on this node, when the launcher says.
    pub local_world: Option<usize>,
    /// Rank 0's rendezvous address, `host:port`, when the environment names it (`MASTER_ADDR`/`MASTER_PORT`;
    /// torchrun always does). Without it an MPI run sends rank 0's address through MPI itself, and a one-node
    /// Slurm step uses the loopback.
    pub master: Option<String>,
}

impl Launch {
    /// A single-process run.
    pub fn single() -> Self {
        Self { launcher: Launcher::Single, rank: 0, world: 1, local_rank: 0, local_world: Some(1), master: None }
    }

    /// Reads the launcher's variables through `get` (the binary passes the process environment, tests a map).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |var: &str| -> Result<Option<usize>> {
            match get(var) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| DistError::Env {
                    var: var.into(),
                    reason: format!("{v:?} is not a non-negative integer"),
                }),
            }
        };
        let need = |var: &str| -> Result<usize> {
            num(var)?.ok_or_else(|| DistError::Env { var: var.into(), reason: "not set".into() })
        };
        let master = |default_host: Option<&str>| -> Result<Option<String>> {
            let host = get("MASTER_ADDR").filter(|h| !h.trim().is_empty()).or(default_host.map(str::to_string));
            let Some(host) = host else { return Ok(None) };
            let port = match get("MASTER_PORT") {
                None => DEFAULT_PORT,
                Some(p) => p.trim().parse::<u16>().map_err(|_| DistError::Env {
                    var: "MASTER_PORT".into(),
                    reason: format!("{p:?} is not a port number"),
                })?,
            };
            Ok(Some(format!("{}:{port}", host.trim())))
        };
        let launch = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            let (rank, world) = (need("RANK")?, need("WORLD_SIZE")?);
            let master = master(None)?.ok_or_else(|| DistError::Env {
                var: "MASTER_ADDR".into(),
                reason: "not set (torchrun sets it)".into(),
            })?;
            Self {
                launcher: Launcher::Torchrun,
                rank,
                world,
                local_rank: num("LOCAL_RANK")?.unwrap_or(rank),
                local_world: num("LOCAL_WORLD_SIZE")?,
                master: Some(master),
            }
        } else if get("OMPI_COMM_WORLD_RANK").is_some() {
            Self {
                launcher: Launcher::Mpi,
                rank: need("OMPI_COMM_WORLD_RANK")?,
                world: need("OMPI_COMM_WORLD_SIZE")?,
                local_rank: num("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0),
                local_world: num("OMPI_COMM_WORLD_LOCAL_SIZE")?,
                master: master(None)?,
            }
        } else if get("SLURM_STEP_NUM_TASKS").is_some() && get("SLURM_PROCID").is_some() {
            let nodes = num("SLURM_STEP_NUM_NODES")?.unwrap_or(1);
            let world = need("SLURM_STEP_NUM_TASKS")?;
            // One node: every rank can reach rank 0 on the loopback. Several: rank 0's host must be named.
            let master = master((nodes <= 1).then_some("127.0.0.1"))?;
            if world > 1 && master.is_none() {
                return Err(DistError::Env {
                    var: "MASTER_ADDR".into(),
                    reason: format!("not set, and this srun step spans {nodes} nodes: export rank 0's host name"),
                });
            }
            Self {
                launcher: Launcher::Slurm,
                rank: need("SLURM_PROCID")?,
                world,
                local_rank: num("SLURM_LOCALID")?.unwrap_or(0),
                local_world: (nodes <= 1).then_some(world),
                master,
            }
        } else {
            return Ok(Self::single());
        };
        if launch.world == 0 || launch.rank >= launch.world {
            return Err(DistError::Env {
                var: "rank".into(),
                reason: format!("{}: rank {} is not in 0..{}", launch.launcher.name(), launch.rank, launch.world),
            });
        }
        if launch.local_world.is_some_and(|l| launch.local_rank >= l) {
            return Err(DistError::Env {
                var: "local rank".into(),
                reason: format!(
                    "{}: local rank {} is not in 0..{}",
                    launch.launcher.name(),
                    launch.local_rank,
                    launch.local_world.unwrap_or(0)
                ),
            });
        }
        Ok(launch)
    }

    /// Whether the run has more than one rank.
    pub fn is_distributed(&self) -> bool {
        self.world > 1
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Launch> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Launch::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_is_a_single_process() {
        assert_eq!(read(&[]).unwrap(), Launch::single());
    }

    #[test]
    fn torchrun_variables() {
        let l = read(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.world, l.local_rank, l.local_world), (Launcher::Torchrun, 3, 4, 1, Some(2)));
        assert_eq!(l.master.as_deref(), Some("node0:1234"));
        let e = read(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR"), "{e}");
        let e = read(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err().to_string();
        assert!(e.contains("rank 2 is not in 0..2"), "{e}");
        let e = read(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err().to_string();
        assert!(e.contains("RANK") && e.contains("\"x\""), "{e}");
    }

    #[test]
    fn open_mpi_variables() {
        let l = read(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.world, l.local_rank, l.local_world), (Launcher::Mpi, 1, 2, 1, Some(2)));
        assert_eq!(l.master, None);
        let l = read(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("MASTER_ADDR", "a")]).unwrap();
        assert_eq!(l.master.as_deref(), Some("a:29500"));
    }

    #[test]
    fn slurm_step_variables() {
        let one_node = [("SLURM_PROCID", "1"), ("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_LOCALID", "1")];
        let l = read(&one_node).unwrap();
        assert_eq!((l.launcher, l.rank, l.world, l.local_rank), (Launcher::Slurm, 1, 2, 1));
        assert_eq!(l.master.as_deref(), Some("127.0.0.1:29500"));
        let two_nodes = [("SLURM_PROCID", "3"), ("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_STEP_NUM_NODES", "2")];
        let e = read(&two_nodes).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR") && e.contains("2 nodes"), "{e}");
        // An sbatch script outside any srun step is one process.
        assert_eq!(read(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).unwrap(), Launch::single());
    }
}
