//! What a backend constructor is given: the rank's bootstrap and, in-process, its group.
//!
//! In-process ranks share a [`ThreadGroup`]: a per-process table where backends whose
//! ranks must be created together (like `LocalComm::create(n)`) build the whole group
//! once, on whichever rank gets there first, and every rank takes its own handle.
//! Multi-process ranks have no group; they meet through the bootstrap only.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use comm_core::{Bootstrap, Error, Result};

use crate::launch::Mode;

/// One rank's view of the job, handed to every [`Constructor`](super::Constructor).
#[derive(Clone)]
pub struct RankContext {
    mode: Mode,
    bootstrap: Arc<dyn Bootstrap>,
    group: Option<Arc<ThreadGroup>>,
}

impl RankContext {
    /// A rank of an in-process group.
    pub fn threads(bootstrap: Arc<dyn Bootstrap>, group: Arc<ThreadGroup>) -> Self {
        RankContext {
            mode: Mode::Threads,
            bootstrap,
            group: Some(group),
        }
    }

    /// A rank that is a whole process (started by a launcher).
    pub fn process(mode: Mode, bootstrap: Arc<dyn Bootstrap>) -> Self {
        RankContext {
            mode,
            bootstrap,
            group: None,
        }
    }

    /// How the ranks were started.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.bootstrap.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.bootstrap.world_size()
    }

    /// The job's bootstrap. `allreduce-perf` also uses it to gather timings, so backends
    /// that keep it must use it collectively (every rank, same order), as the trait asks.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.bootstrap
    }

    /// The CUDA device of this rank: `local_rank % device_count`, the rule of the GPU
    /// backends. Fails where CUDA or a GPU is missing.
    pub fn device(&self) -> Result<usize> {
        match comm_core::cuda::device_count()? {
            0 => Err(Error::NoDevice("no CUDA device".into())),
            n => Ok(self.bootstrap.local_rank() % n),
        }
    }

    /// The in-process group; `None` when each rank is a process.
    pub fn thread_group(&self) -> Option<&ThreadGroup> {
        self.group.as_deref()
    }
}

impl fmt::Debug for RankContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RankContext")
            .field("mode", &self.mode)
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .finish_non_exhaustive()
    }
}

/// State shared by the in-process ranks of one run of one backend.
#[derive(Debug)]
pub struct ThreadGroup {
    world_size: usize,
    slots: Mutex<HashMap<&'static str, Box<dyn Any + Send>>>,
}

impl ThreadGroup {
    /// An empty group of `world_size` ranks.
    pub fn new(world_size: usize) -> Arc<Self> {
        Arc::new(ThreadGroup {
            world_size,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank `rank`'s element of the vector that `make(world_size)` builds. The first
    /// caller for `key` builds it; each rank must take its element once.
    ///
    /// # Panics
    /// If `make` does not return `world_size` elements, or a rank takes twice: both are
    /// bugs of the calling backend, not of user input.
    pub fn take<T: Send + 'static>(
        &self,
        key: &'static str,
        rank: usize,
        make: impl FnOnce(usize) -> Vec<T>,
    ) -> T {
        // A panic in another rank's `make` poisons the lock; the table is still consistent.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(key).or_insert_with(|| {
            let all = make(self.world_size);
            assert_eq!(
                all.len(),
                self.world_size,
                "group `{key}` has the wrong size"
            );
            let all: Vec<Option<T>> = all.into_iter().map(Some).collect();
            Box::new(all)
        });
        let all = slot
            .downcast_mut::<Vec<Option<T>>>()
            .unwrap_or_else(|| panic!("group `{key}` was built with another type"));
        all[rank]
            .take()
            .unwrap_or_else(|| panic!("rank {rank} took `{key}` twice"))
    }
}
