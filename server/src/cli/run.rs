//! `sluice run`: bind the batch, load weights and inputs, run on the GPU or CPU, print a
//! summary per output and write .npy files.

use super::{load, Device, RunArgs};
use crate::npy;
use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_engine::runtime::{self, GpuContext, GpuExecutable, Plan};
use sluice_engine::{cpu, Tensor};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Runs the command.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let graph = match load::graph(&args.graph)? {
        Ok(g) => g,
        Err(problems) => {
            load::report(&args.graph, &problems);
            return Ok(ExitCode::FAILURE);
        }
    };
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let bindings: HashMap<String, usize> = graph
        .symbols()
        .into_iter()
        .map(|s| (s, args.batch))
        .collect();
    let bound = match graph.bind(&bindings) {
        Ok(g) => g,
        Err(problems) => {
            eprintln!("with batch {}: {}", args.batch, problems.render());
            return Ok(ExitCode::FAILURE);
        }
    };
    let weights = load::weights(&args.graph, &bound)?;
    let mut inputs = runtime::random_inputs(&bound, args.seed)?;
    for spec in &args.inputs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("--input takes NAME=FILE.npy, got '{spec}'");
        };
        if bound.input_type(name).is_none() {
            let known: Vec<&str> = bound.inputs.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "--input {name}: the graph has no input '{name}' (inputs: {})",
                known.join(", ")
            );
        }
        let t = npy::read(&PathBuf::from(file)).with_context(|| format!("--input {name}"))?;
        inputs.insert(name.to_string(), t);
    }
    runtime::check_inputs(&bound, &inputs)?;
    let (outputs, device_name, compile_s, run_s) = match args.device {
        Device::Cpu => {
            let t = Instant::now();
            let out = cpu::run(&bound, &weights, &inputs)?;
            (
                out,
                "cpu (reference)".to_string(),
                0.0,
                t.elapsed().as_secs_f64(),
            )
        }
        Device::Gpu => pollster::block_on(async {
            let ctx = GpuContext::new().await?;
            let t0 = Instant::now();
            let plan = Plan::new(&bound)?;
            let exe = GpuExecutable::new(&ctx, plan, &weights).await?;
            let compile = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let out = exe.run(&inputs).await?;
            let name = format!(
                "{} ({}, {})",
                ctx.adapter.name, ctx.adapter.backend, ctx.adapter.driver
            );
            Ok::<_, anyhow::Error>((out, name, compile, t1.elapsed().as_secs_f64()))
        })?,
    };
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, t) in &outputs {
            let file = dir.join(format!("{}.npy", name.replace([':', '/', '\\'], "_")));
            npy::write(&file, t)?;
        }
    }
    print_summary(
        args,
        &graph.doc.name,
        &outputs,
        &device_name,
        compile_s,
        run_s,
    );
    Ok(ExitCode::SUCCESS)
}

fn head(t: &Tensor, n: usize) -> Vec<f32> {
    t.to_f32_vec().into_iter().take(n).collect()
}

fn print_summary(
    args: &RunArgs,
    name: &str,
    outputs: &[(String, Tensor)],
    device: &str,
    compile_s: f64,
    run_s: f64,
) {
    if args.json {
        let outs: Vec<_> = outputs
            .iter()
            .map(|(n, t)| json!({ "name": n, "shape": t.shape, "dtype": t.dtype(), "first": head(t, 8), "checksum": t.checksum() }))
            .collect();
        let doc = json!({
            "graph": name, "batch": args.batch, "device": device,
            "compile_seconds": compile_s, "run_seconds": run_s, "outputs": outs,
            "written_to": args.output,
        });
        println!("{doc}");
        return;
    }
    println!("graph '{name}', batch {}, on {device}", args.batch);
    for (n, t) in outputs {
        let first: Vec<String> = head(t, 6).iter().map(|v| format!("{v:.6}")).collect();
        println!(
            "  {n}: {} {:?}  first [{}]  checksum {:.6}",
            t.dtype(),
            t.shape,
            first.join(", "),
            t.checksum()
        );
    }
    println!(
        "  time: {:.3} ms run, {:.3} ms plan+compile",
        run_s * 1e3,
        compile_s * 1e3
    );
    match &args.output {
        Some(dir) => println!(
            "  wrote {} .npy file(s) to {}",
            outputs.len(),
            dir.display()
        ),
        None => println!("  (pass --output DIR to write .npy files)"),
    }
}
