//! `allreduce-perf-mpi`: `allreduce-perf` built with feature `mpi` (the MPI bootstrap and
//! the `mpi` backend). A binary of its own, so that building it leaves the default
//! `allreduce-perf` (environment bootstrap) as it was.

fn main() -> std::process::ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    comm_examples::perf::cli::main()
}
