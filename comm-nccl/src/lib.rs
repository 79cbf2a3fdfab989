//! `comm-nccl`: the NCCL backend (placeholder).
#![warn(missing_docs)]
