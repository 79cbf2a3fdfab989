//! Environment + TCP bootstrap (placeholder, being written).
/// Placeholder.
#[derive(Debug)]
pub struct EnvBootstrap;
/// Placeholder.
#[derive(Debug)]
pub struct LaunchInfo;
