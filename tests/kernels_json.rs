//! Writes every generated kernel that runs without `shader-f16` and subgroups as JSON (label and
//! source), for the browser test that compiles each one with Chromium's WebGPU:
//! `cargo run -p sluice-tests --example kernels -- OUT.json`.

use sluice_tests::kernels::generated_kernels;

fn main() {
    let Some(out) = std::env::args().nth(1) else {
        eprintln!("usage: kernels OUT.json");
        std::process::exit(2);
    };
    let portable: Vec<_> = generated_kernels()
        .into_iter()
        .filter(|k| !k.needs_f16 && !k.needs_subgroups)
        .collect();
    let text = serde_json::to_string(&portable).expect("kernels serialise");
    if let Err(e) = std::fs::write(&out, text) {
        eprintln!("cannot write {out}: {e}");
        std::process::exit(1);
    }
    println!("{} portable kernels written to {out}", portable.len());
}
