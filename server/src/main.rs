//! `sluice`: runs, checks, plans and serves Sluice graphs (see the library crate).

fn main() -> std::process::ExitCode {
    sluice_server::main()
}
