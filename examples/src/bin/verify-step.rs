//! `verify-step`: the seeds' decode step (122 dependent all-reduces of 42 KB bf16) timed
//! per backend and for `auto`; see `comm_examples::step`.

fn main() -> std::process::ExitCode {
    comm_examples::launch::prefer_more_hardware_queues();
    comm_examples::step::main()
}
