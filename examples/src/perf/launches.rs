//! Which launch modes a sweep measures: eager calls, CUDA-graph replays, or both.
//!
//! `--graph` asks for graph replays alone, and a backend that cannot be captured (host
//! memory) is an error; `--tune` measures both, since the selector keeps eager and graph
//! times apart, and a backend that cannot be captured then gets eager rows only.

use serde::{Deserialize, Serialize};

use comm_core::{Capabilities, Error, Result};
use comm_select::Launch;

/// The launch modes of a sweep, as the run's metadata names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launches {
    /// Each timed call is made from the host (the default).
    #[default]
    Eager,
    /// The timed calls of a size are captured into one CUDA graph whose replays are timed
    /// (`--graph`, nccl-tests' `-G`); device backends only.
    Graph,
    /// Eager tables for every backend, and graph tables too for those that can be captured
    /// (`--tune` without `--graph`).
    Both,
}

impl Launches {
    /// `eager`, `graph` or `both`.
    pub const fn name(self) -> &'static str {
        match self {
            Launches::Eager => "eager",
            Launches::Graph => "graph",
            Launches::Both => "both",
        }
    }

    /// The modes to measure `backend` in, eager first; `capturable` is what
    /// [`capturable`] says of it. Graph mode alone on a backend that cannot be captured
    /// is [`Error::Unsupported`].
    pub fn of_backend(
        self,
        backend: &str,
        capturable: std::result::Result<(), String>,
    ) -> Result<Vec<Launch>> {
        match (self, capturable) {
            (Launches::Eager, _) | (Launches::Both, Err(_)) => Ok(vec![Launch::Eager]),
            (Launches::Graph, Ok(())) => Ok(vec![Launch::Graph]),
            (Launches::Both, Ok(())) => Ok(vec![Launch::Eager, Launch::Graph]),
            (Launches::Graph, Err(why)) => Err(Error::Unsupported(format!(
                "{backend} {why}; --graph captures device calls into CUDA graphs (measure \
                 {backend} without --graph)"
            ))),
        }
    }
}

impl std::fmt::Display for Launches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a backend's calls can be captured into a CUDA graph, as the sweep makes them
/// (on device memory when `on_device`); the reason when not. `selects` is true for `auto`,
/// whose capabilities are the union of its members': a host member makes it look
/// uncapturable, but a device call only ever goes to a device member.
pub fn capturable(
    caps: &Capabilities,
    on_device: bool,
    selects: bool,
) -> std::result::Result<(), String> {
    if !on_device {
        Err("runs on host memory".into())
    } else if !caps.graph_capture_safe && !selects {
        Err("cannot be captured into a CUDA graph".into())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(graph_capture_safe: bool) -> Capabilities {
        let mut caps = Capabilities::host_complete();
        caps.graph_capture_safe = graph_capture_safe;
        caps
    }

    #[test]
    fn each_mode_measures_what_it_says() {
        let yes = || Ok(());
        assert_eq!(
            Launches::Eager.of_backend("nccl", yes()).unwrap(),
            [Launch::Eager]
        );
        assert_eq!(
            Launches::Graph.of_backend("nccl", yes()).unwrap(),
            [Launch::Graph]
        );
        assert_eq!(
            Launches::Both.of_backend("nccl", yes()).unwrap(),
            [Launch::Eager, Launch::Graph]
        );
    }

    #[test]
    fn host_backends_are_eager_only_and_refuse_graph_mode() {
        let host = capturable(&caps(false), false, false);
        assert_eq!(
            Launches::Both.of_backend("local", host.clone()).unwrap(),
            [Launch::Eager]
        );
        assert_eq!(
            Launches::Eager.of_backend("local", host.clone()).unwrap(),
            [Launch::Eager]
        );
        let err = Launches::Graph.of_backend("local", host).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("local runs on host memory") && msg.contains("without --graph"),
            "{msg}"
        );
    }

    #[test]
    fn capture_safety_decides_on_device() {
        assert_eq!(capturable(&caps(true), true, false), Ok(()));
        assert!(capturable(&caps(false), true, false).is_err());
        // `auto` routes device calls to device members, which can be captured.
        assert_eq!(capturable(&caps(false), true, true), Ok(()));
        assert!(capturable(&caps(true), false, true).is_err());
    }

    #[test]
    fn names_are_what_the_json_says() {
        for mode in [Launches::Eager, Launches::Graph, Launches::Both] {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{mode}\""));
            assert_eq!(serde_json::from_str::<Launches>(&json).unwrap(), mode);
        }
    }
}
