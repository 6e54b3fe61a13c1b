//! `sluice devices`: adapters with backend, type, features and key limits, and the rates
//! measured on the adapter runs use (what the stage partitioner weighs work with).

use anyhow::Result;
use serde_json::json;
use sluice_engine::gpu::context::{list_adapters, INSTALL_HINT};
use sluice_engine::gpu::GpuContext;
use sluice_engine::plan::cost::Rates;
use std::process::ExitCode;

/// Prints a device's rates.
fn print_rates(name: &str, r: &Rates) {
    println!("rates measured on {name} (used to place pipeline stages):");
    println!("    compute:         {:.2} GFLOP/s", r.flops_per_s / 1e9);
    println!("    memory traffic:  {:.2} GB/s", r.bytes_per_s / 1e9);
    println!(
        "    stage transfer:  {:.2} GB/s (device to host to device)",
        r.transfer_bytes_per_s / 1e9
    );
    println!("    pass overhead:   {:.1} µs", r.pass_overhead_s * 1e6);
}

/// Runs the command.
pub fn devices(as_json: bool, recalibrate: bool) -> Result<ExitCode> {
    let adapters = pollster::block_on(list_adapters());
    let measured = if adapters.is_empty() {
        None
    } else {
        let ctx = pollster::block_on(GpuContext::new())?;
        let rates = crate::rates::rates_for(&ctx, recalibrate)?;
        Some((ctx.adapter.name.clone(), rates))
    };
    if as_json {
        let doc = json!({
            "adapters": adapters,
            "rates": measured.as_ref().map(|(name, r)| json!({ "adapter": name, "rates": r })),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
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
    if let Some((name, r)) = &measured {
        print_rates(name, r);
        if let Some(dir) = crate::rates::cache_dir() {
            println!(
                "    (kept in {}; `sluice devices --recalibrate` measures again)",
                dir.join("rates.json").display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
