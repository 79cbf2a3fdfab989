//! What the launcher told this process: its rank, the world size, where the store is.
//!
//! Launchers announce ranks through environment variables. [`LaunchInfo::from_vars`] reads
//! them from any lookup function (so tests pass explicit maps), in this order: torchrun
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), OpenMPI's `mpirun`
//! (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`), then PMI (`PMI_RANK`,
//! `PMI_SIZE`, with MPICH's `MPI_LOCALRANKID`/`MPI_LOCALNRANKS`; MPICH's Hydra, Slurm).
//!
//! [`StoreConfig`] says where rank 0's TCP store listens: `COMM_MASTER_ADDR` or
//! `MASTER_ADDR` (default `127.0.0.1`, loopback), and `COMM_MASTER_PORT` or `MASTER_PORT`.
//! The `COMM_` names win, so the store can move off a port that another store (torch's)
//! already holds. Without a port, one is derived from the job's identity, see
//! [`StoreConfig::from_vars`].

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{Error, Result};

/// Where this process sits in a job, as its launcher announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank, in `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank among the processes of this node, in `0..local_world_size`.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// Which convention the variables followed: `torchrun`, `openmpi`, `pmi`, or `none`.
    pub launcher: &'static str,
}

/// One launcher's variable names.
struct Scheme {
    launcher: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
}

const SCHEMES: [Scheme; 3] = [
    Scheme {
        launcher: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: "LOCAL_WORLD_SIZE",
    },
    Scheme {
        launcher: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Scheme {
        launcher: "pmi",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
    },
];

impl LaunchInfo {
    /// Reads the launch variables of this process; `Ok(None)` when no launcher set any.
    /// See [`Self::from_vars`].
    pub fn detect() -> Result<Option<LaunchInfo>> {
        Self::from_vars(env_var)
    }

    /// Reads the launch variables through `get` (name to value; `None` when unset).
    ///
    /// The first launcher whose rank variable is set wins. Its size variable must then be
    /// set too; the local pair is optional, and where it is absent every rank is taken to
    /// be on one node (`local_rank = rank`). Values that are not integers, or that do not
    /// fit together (`rank >= world_size`, ...), are an [`Error::Bootstrap`] naming the
    /// variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
        for scheme in &SCHEMES {
            let Some(rank) = number(&get, scheme.rank)? else {
                continue;
            };
            let world_size = number(&get, scheme.size)?.ok_or_else(|| {
                Error::Bootstrap(format!(
                    "{} is set but {} is not ({} launch variables)",
                    scheme.rank, scheme.size, scheme.launcher
                ))
            })?;
            let local_rank = number(&get, scheme.local_rank)?;
            let local_size = number(&get, scheme.local_size)?;
            let (local_rank, local_world_size) = match (local_rank, local_size) {
                (Some(r), Some(s)) => (r, s),
                (None, None) => (rank, world_size),
                (Some(_), None) | (None, Some(_)) => {
                    return Err(Error::Bootstrap(format!(
                        "set both {} and {}, or neither",
                        scheme.local_rank, scheme.local_size
                    )));
                }
            };
            let info = LaunchInfo {
                rank,
                world_size,
                local_rank,
                local_world_size,
                launcher: scheme.launcher,
            };
            info.validate(scheme)?;
            return Ok(Some(info));
        }
        Ok(None)
    }

    /// A job of one process: what a program started without a launcher is.
    pub fn single() -> LaunchInfo {
        LaunchInfo {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            launcher: "none",
        }
    }

    fn validate(&self, s: &Scheme) -> Result<()> {
        let fail = |why: String| {
            Err(Error::Bootstrap(format!(
                "{} launch variables: {why}",
                s.launcher
            )))
        };
        if self.world_size == 0 {
            return fail(format!("{} is 0", s.size));
        }
        if self.rank >= self.world_size {
            return fail(format!(
                "{}={} is not below {}={}",
                s.rank, self.rank, s.size, self.world_size
            ));
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return fail(format!(
                "{}={} must be in 1..={}",
                s.local_size, self.local_world_size, self.world_size
            ));
        }
        if self.local_rank >= self.local_world_size {
            return fail(format!(
                "{}={} is not below {}={}",
                s.local_rank, self.local_rank, s.local_size, self.local_world_size
            ));
        }
        Ok(())
    }
}

impl fmt::Display for LaunchInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {} (local {} of {}, launcher {})",
            self.rank, self.world_size, self.local_rank, self.local_world_size, self.launcher
        )
    }
}

/// Reads one variable of this process's environment (non-UTF-8 values read lossily, and then
/// fail to parse with a clear message).
pub(super) fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

fn number(get: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    let Some(value) = get(name) else {
        return Ok(None);
    };
    value
        .trim()
        .parse::<usize>()
        .map(Some)
        .map_err(|_| Error::Bootstrap(format!("{name}=`{value}` is not a non-negative integer")))
}

/// First port of the range that derived store ports fall in.
const DERIVED_PORT_BASE: u16 = 20000;
/// Number of ports in that range: `20000..32000`, below Linux's ephemeral range
/// (32768..61000), so that a derived port never collides with an outgoing connection's.
const DERIVED_PORT_SPAN: u16 = 12000;

/// Variables that name one job (equal on all its ranks, different between jobs), in the
/// order they are looked for. Each entry is a group: all of its variables must be set.
const JOB_IDENTITY: [&[&str]; 4] = [
    // PMIx (OpenMPI 4 and 5, PRRTE, Slurm's pmix plugin): the job's namespace.
    &["PMIX_NAMESPACE"],
    // OpenMPI's own job id (ORTE), for builds without PMIx in the environment.
    &["OMPI_MCA_ess_base_jobid"],
    // Slurm: one job step.
    &["SLURM_JOB_ID", "SLURM_STEP_ID"],
    // torchrun (elastic): the run id (`none` for every job of static rendezvous, its
    // default) and the port of torch's own store, which no two jobs on a host share.
    &["TORCHELASTIC_RUN_ID", "MASTER_PORT"],
];

/// Where rank 0's store listens, and the key that tells this job's ranks from another's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoreConfig {
    pub(super) addr: SocketAddr,
    /// Hash of the job identity (0 when there is none); rank 0 refuses other keys.
    pub(super) job_key: u64,
    /// How the port was chosen, for error messages.
    pub(super) port_source: String,
}

impl StoreConfig {
    /// Resolves the store address from `get`.
    ///
    /// The port is `COMM_MASTER_PORT`, else `MASTER_PORT`, else derived from the job's
    /// identity: `20000 + fnv1a64("NAME=value\n"...) % 12000` over the first group of
    /// `PMIX_NAMESPACE`, `OMPI_MCA_ess_base_jobid`, (`SLURM_JOB_ID`, `SLURM_STEP_ID`),
    /// (`TORCHELASTIC_RUN_ID`, `MASTER_PORT`) that is set; under torchrun (its launcher sets
    /// `TORCHELASTIC_RUN_ID`) `MASTER_PORT` is torch's own store's, so the port is always
    /// derived there unless `COMM_MASTER_PORT` names one. Every rank of one `mpirun` sees the same
    /// identity, and two concurrent jobs see different ones, so they pick the same port and
    /// different ports respectively (two jobs land on one port with probability 1/12000;
    /// the second then fails to bind with a message that says to set `MASTER_PORT`).
    /// Ranks spread over several nodes (`local_world_size < world_size`) must name the
    /// address: loopback would only reach their own node.
    pub(super) fn from_vars(
        info: &LaunchInfo,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreConfig> {
        let identity = job_identity(&get);
        let job_key = identity.as_deref().map_or(0, fnv1a64);
        // Under torchrun, MASTER_PORT is where torch's launcher serves its own store for the
        // whole run: ours derives a port of its own (COMM_MASTER_PORT still wins).
        let torch_holds_master_port = get("TORCHELASTIC_RUN_ID").is_some();
        let explicit_port = ["COMM_MASTER_PORT", "MASTER_PORT"]
            .into_iter()
            .filter(|&name| !(torch_holds_master_port && name == "MASTER_PORT"))
            .find_map(|name| get(name).map(|v| (name, v)));
        let (port, port_source) = match (explicit_port, &identity) {
            (Some((name, value)), _) => match value.trim().parse::<u16>() {
                Ok(port) if port != 0 => (port, format!("{name}={port}")),
                _ => {
                    return Err(Error::Bootstrap(format!(
                        "{name}=`{value}` is not a port number (1..=65535)"
                    )));
                }
            },
            (None, Some(identity)) => {
                let port = derived_port(identity);
                let names: Vec<&str> = identity
                    .lines()
                    .filter_map(|l| l.split('=').next())
                    .collect();
                (
                    port,
                    format!("port {port} derived from {}", names.join(", ")),
                )
            }
            (None, None) => {
                return Err(Error::Bootstrap(format!(
                    "{info}: set MASTER_PORT (and MASTER_ADDR) for the bootstrap store; \
                     the launcher gives no job identity to derive a port from"
                )));
            }
        };
        let host = ["COMM_MASTER_ADDR", "MASTER_ADDR"]
            .into_iter()
            .find_map(&get)
            .map(|h| h.trim().to_string());
        let host = match host {
            Some(h) if !h.is_empty() => h,
            _ if info.local_world_size < info.world_size => {
                return Err(Error::Bootstrap(format!(
                    "{info}: the ranks span several nodes, so MASTER_ADDR must name rank 0's \
                     host (the default, 127.0.0.1, only reaches this node)"
                )));
            }
            _ => "127.0.0.1".to_string(),
        };
        let addr = resolve(&host, port)?;
        Ok(StoreConfig {
            addr,
            job_key,
            port_source,
        })
    }
}

/// `NAME=value` lines of the first complete identity group, if any.
fn job_identity(get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    JOB_IDENTITY.iter().find_map(|group| {
        let values: Option<Vec<String>> = group
            .iter()
            .map(|name| get(name).map(|v| format!("{name}={v}\n")))
            .collect();
        values.map(|v| v.concat())
    })
}

fn derived_port(identity: &str) -> u16 {
    DERIVED_PORT_BASE + (fnv1a64(identity) % u64::from(DERIVED_PORT_SPAN)) as u16
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike `std`'s hasher.
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    // Bracketed IPv6 literals (`[::1]`) are accepted as they are written in URLs.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let mut addrs = (bare, port)
        .to_socket_addrs()
        .map_err(|e| Error::Bootstrap(format!("cannot resolve MASTER_ADDR `{host}`: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Error::Bootstrap(format!("MASTER_ADDR `{host}` resolves to no address")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn info(pairs: &[(&str, &str)]) -> Result<Option<LaunchInfo>> {
        LaunchInfo::from_vars(vars(pairs))
    }

    #[test]
    fn no_launcher_is_none() {
        assert_eq!(info(&[("HOME", "/root")]).unwrap(), None);
    }

    #[test]
    fn torchrun_variables_are_read() {
        let got = info(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            LaunchInfo {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                local_world_size: 4,
                launcher: "torchrun",
            }
        );
        // Without the local pair, one node is assumed.
        let got = info(&[("RANK", "2"), ("WORLD_SIZE", "3")])
            .unwrap()
            .unwrap();
        assert_eq!((got.local_rank, got.local_world_size), (2, 3));
    }

    /// torchrun's launcher holds MASTER_PORT with torch's store: ours takes a port derived
    /// from the run id and that port, alike on every rank, unless COMM_MASTER_PORT says.
    #[test]
    fn under_torchrun_the_store_leaves_master_port_to_torch() {
        let torchrun = info(&[("RANK", "1"), ("WORLD_SIZE", "2")])
            .unwrap()
            .unwrap();
        let job = |port: &'static str| {
            let port = port.to_string();
            move |name: &str| match name {
                "TORCHELASTIC_RUN_ID" => Some("none".to_string()),
                "MASTER_PORT" => Some(port.clone()),
                "MASTER_ADDR" => Some("127.0.0.1".to_string()),
                _ => None,
            }
        };
        let a = StoreConfig::from_vars(&torchrun, job("29500")).unwrap();
        assert_ne!(a.addr.port(), 29500);
        assert!((20000..32000).contains(&a.addr.port()), "{a:?}");
        assert_eq!(a, StoreConfig::from_vars(&torchrun, job("29500")).unwrap());
        let b = StoreConfig::from_vars(&torchrun, job("29501")).unwrap();
        assert_ne!(a.job_key, b.job_key);
        let forced = vars(&[
            ("TORCHELASTIC_RUN_ID", "none"),
            ("MASTER_PORT", "29500"),
            ("COMM_MASTER_PORT", "29600"),
        ]);
        assert_eq!(
            StoreConfig::from_vars(&torchrun, forced)
                .unwrap()
                .addr
                .port(),
            29600
        );
    }

    #[test]
    fn torchrun_wins_over_openmpi_which_wins_over_pmi() {
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "1"),
        ];
        let got = info(&ompi).unwrap().unwrap();
        assert_eq!((got.launcher, got.rank, got.local_rank), ("openmpi", 3, 1));
        let mut both = ompi.to_vec();
        both.extend([("RANK", "0"), ("WORLD_SIZE", "1")]);
        assert_eq!(info(&both).unwrap().unwrap().launcher, "torchrun");
        let pmi = info(&[
            ("PMI_RANK", "6"),
            ("PMI_SIZE", "7"),
            ("MPI_LOCALRANKID", "0"),
            ("MPI_LOCALNRANKS", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((pmi.launcher, pmi.rank, pmi.world_size), ("pmi", 6, 7));
        assert_eq!((pmi.local_rank, pmi.local_world_size), (0, 1));
    }

    #[test]
    fn malformed_values_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "one"), ("WORLD_SIZE", "2")], "RANK=`one`"),
            (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK=`-1`"),
            (&[("RANK", "0")], "WORLD_SIZE is not"),
            (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK=2 is not below"),
            (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE is 0"),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
                "LOCAL_WORLD_SIZE",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", "2"),
                    ("LOCAL_WORLD_SIZE", "2"),
                ],
                "LOCAL_RANK=2",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", "0"),
                    ("LOCAL_WORLD_SIZE", "3"),
                ],
                "LOCAL_WORLD_SIZE=3",
            ),
            (
                &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "x")],
                "OMPI_COMM_WORLD_SIZE=`x`",
            ),
            (&[("PMI_RANK", "")], "PMI_RANK=``"),
        ];
        for (case, want) in cases {
            let err = info(case).unwrap_err();
            assert!(
                matches!(&err, Error::Bootstrap(m) if m.contains(want)),
                "{case:?}: {err}"
            );
        }
    }

    fn ompi_info(rank: &str) -> LaunchInfo {
        info(&[
            ("OMPI_COMM_WORLD_RANK", rank),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ])
        .unwrap()
        .unwrap()
    }

    #[test]
    fn an_explicit_port_and_address_are_used() {
        let cfg = StoreConfig::from_vars(
            &ompi_info("1"),
            vars(&[
                ("MASTER_ADDR", "127.0.0.2"),
                ("MASTER_PORT", "29500"),
                ("COMM_MASTER_PORT", "29600"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.addr, "127.0.0.2:29600".parse().unwrap());
        let cfg =
            StoreConfig::from_vars(&ompi_info("1"), vars(&[("MASTER_PORT", "29500")])).unwrap();
        assert_eq!(cfg.addr, "127.0.0.1:29500".parse().unwrap());
        let cfg = StoreConfig::from_vars(
            &ompi_info("0"),
            vars(&[("MASTER_ADDR", "[::1]"), ("MASTER_PORT", "29500")]),
        )
        .unwrap();
        assert_eq!(cfg.addr, "[::1]:29500".parse().unwrap());
        for bad in ["0", "65536", "http"] {
            let err =
                StoreConfig::from_vars(&ompi_info("0"), vars(&[("MASTER_PORT", bad)])).unwrap_err();
            assert!(
                matches!(&err, Error::Bootstrap(m) if m.contains("MASTER_PORT")),
                "{err}"
            );
        }
    }

    #[test]
    fn mpirun_jobs_derive_a_shared_port_that_differs_between_jobs() {
        let job = |id: &str, rank: &str| {
            StoreConfig::from_vars(
                &ompi_info(rank),
                vars(&[("PMIX_NAMESPACE", id), ("OMPI_MCA_ess_base_jobid", "7")]),
            )
            .unwrap()
        };
        let a0 = job("1904148481", "0");
        let a3 = job("1904148481", "3");
        let b0 = job("1904148482", "0");
        assert_eq!(a0, a3);
        assert_ne!(a0.addr.port(), b0.addr.port());
        assert_ne!(a0.job_key, b0.job_key);
        for cfg in [&a0, &b0] {
            let port = cfg.addr.port();
            assert!((DERIVED_PORT_BASE..DERIVED_PORT_BASE + DERIVED_PORT_SPAN).contains(&port));
            assert!(cfg.addr.ip().is_loopback());
            assert!(
                cfg.port_source.contains("PMIX_NAMESPACE"),
                "{}",
                cfg.port_source
            );
        }
        // Over many job ids the ports spread over the range.
        let ports: std::collections::HashSet<u16> = (0..200)
            .map(|i| job(&i.to_string(), "0").addr.port())
            .collect();
        assert!(ports.len() > 190, "{}", ports.len());
    }

    #[test]
    fn no_port_and_no_identity_or_several_nodes_without_address_are_errors() {
        let err = StoreConfig::from_vars(&ompi_info("0"), vars(&[])).unwrap_err();
        assert!(
            matches!(&err, Error::Bootstrap(m) if m.contains("MASTER_PORT")),
            "{err}"
        );
        let two_nodes = info(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        let err =
            StoreConfig::from_vars(&two_nodes, vars(&[("MASTER_PORT", "29500")])).unwrap_err();
        assert!(
            matches!(&err, Error::Bootstrap(m) if m.contains("MASTER_ADDR")),
            "{err}"
        );
    }
}
