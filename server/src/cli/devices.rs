//! `sluice devices`: adapters with backend, type, features and key limits.

use anyhow::Result;
use sluice_engine::runtime::gpu::{list_adapters, INSTALL_HINT};
use std::process::ExitCode;

/// Runs the command.
pub fn devices(as_json: bool) -> Result<ExitCode> {
    let adapters = pollster::block_on(list_adapters());
    if as_json {
        println!("{}", serde_json::to_string_pretty(&adapters)?);
        return Ok(ExitCode::SUCCESS);
    }
    if adapters.is_empty() {
        println!("no GPU adapters found; {INSTALL_HINT}");
        return Ok(ExitCode::SUCCESS);
    }
    for (i, a) in adapters.iter().enumerate() {
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!("[{i}] {} ({}, {})", a.name, a.backend, a.device_type);
        println!("    driver:          {}", a.driver);
        println!(
            "    features:        shader-f16 {}, timestamp queries {}, subgroups {}",
            yes(a.shader_f16),
            yes(a.timestamp_query),
            yes(a.subgroups)
        );
        println!("    max buffer:      {} MiB", a.max_buffer_size >> 20);
        println!("    max binding:     {} MiB", a.max_storage_binding >> 20);
        println!(
            "    max workgroups:  {} per dimension, {} invocations each",
            a.max_workgroups_per_dimension, a.max_invocations_per_workgroup
        );
    }
    Ok(ExitCode::SUCCESS)
}
