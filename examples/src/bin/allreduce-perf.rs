//! `allreduce-perf`: all-reduce latency and bandwidth over a sweep of message sizes.
//! See `allreduce-perf --help` and [`comm_examples::perf`].

fn main() -> std::process::ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    comm_examples::perf::cli::main()
}
