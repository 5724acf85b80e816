//! The `fga-relay` binary: everything is in the library; see `fga_relay::cli`.

fn main() -> std::process::ExitCode {
    fga_relay::cli::main()
}
