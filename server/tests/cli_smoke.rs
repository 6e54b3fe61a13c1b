//! The binary starts and describes itself. (Its presence also makes `cargo test` build the
//! `sluice` binary that the workspace tests in `tests/` drive.)

#[test]
fn help_lists_the_commands() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "validate", "devices", "ops"] {
        assert!(text.contains(cmd), "{cmd} missing from --help:\n{text}");
    }
}
