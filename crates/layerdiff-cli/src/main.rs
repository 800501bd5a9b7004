//! The `layerdiff` command (Rust entry point).

fn main() -> std::process::ExitCode {
    layerdiff_cli::main(std::env::args_os().collect())
}
