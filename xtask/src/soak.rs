//! `cargo xtask soak [--minutes N]`: builds `sluice`, then runs the soak of the
//! adversarial suite (`tests/adversarial.rs`, the ignored `soak` test; its code is
//! `tests/support/soak.rs`) for N minutes (default 10): 20 concurrent loopback clients
//! mixing valid runs, checks and graph writes with hostile requests against one
//! `sluice serve`, its memory and descriptors sampled; it prints a summary and fails when
//! something leaked, was lost or ended without a reason. Not part of `cargo xtask test`.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Minutes by default.
pub const DEFAULT_MINUTES: f64 = 10.0;

/// `cargo xtask soak [--minutes N]`.
pub fn soak(args: &[String]) -> Result<()> {
    let mut minutes = DEFAULT_MINUTES;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" => {
                minutes = it
                    .next()
                    .and_then(|m| m.parse::<f64>().ok())
                    .filter(|m| *m > 0.0 && m.is_finite())
                    .context("--minutes takes a positive number")?;
            }
            other => bail!("unknown argument '{other}' (usage: cargo xtask soak [--minutes N])"),
        }
    }
    let cargo = crate::cargo();
    crate::run(&cargo, &["build", "-p", "sluice-server"])?;
    println!("$ {cargo} test -p sluice-tests --test adversarial -- --ignored --exact soak --nocapture  (SLUICE_SOAK_MINUTES={minutes})");
    let status = Command::new(&cargo)
        .args([
            "test",
            "-p",
            "sluice-tests",
            "--test",
            "adversarial",
            "--",
            "--ignored",
            "--exact",
            "soak",
            "--nocapture",
        ])
        .env("SLUICE_SOAK_MINUTES", minutes.to_string())
        .status()
        .context("cannot start cargo test")?;
    if !status.success() {
        bail!("the soak failed ({status})");
    }
    Ok(())
}
