//! How every program here answers its command line, so that all behave alike: `--help`
//! prints the usage and exits 0; a bad option prints what is wrong and the usage and
//! exits 2.

use std::fmt::Display;
use std::process::ExitCode;

/// The options in `parsed` (`Ok(None)`: `--help` was asked), or the exit code `program`'s
/// `main` returns at once.
pub fn options_or_exit<T, E: Display>(
    program: &str,
    usage: &str,
    parsed: Result<Option<T>, E>,
) -> Result<T, ExitCode> {
    let usage = usage.trim_end();
    match parsed {
        Ok(Some(options)) => Ok(options),
        Ok(None) => {
            println!("{usage}");
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{program}: {e}\n{usage}");
            Err(ExitCode::from(2))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_and_bad_options_end_the_program_with_their_codes() {
        assert_eq!(
            options_or_exit::<u8, String>("p", "usage", Ok(Some(7))),
            Ok(7)
        );
        assert_eq!(
            options_or_exit::<u8, String>("p", "usage", Ok(None)),
            Err(ExitCode::SUCCESS)
        );
        assert_eq!(
            options_or_exit::<u8, _>("p", "usage", Err("bad")),
            Err(ExitCode::from(2))
        );
    }
}
