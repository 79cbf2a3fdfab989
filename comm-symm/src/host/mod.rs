//! Host backing: symmetric memory in shared memory between the processes of one node.

mod heap;
mod segment;

pub use heap::HostHeap;
pub use segment::Mapping;
