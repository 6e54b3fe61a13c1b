//! Every WGSL kernel the engine generates, for every case of the operator catalogue and the
//! example graphs, parses and validates with naga; and every variant of every shader file
//! is among them.

use sluice_tests::kernels::generated_kernels;

fn validate(label: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{label}: parse error: {}", e.emit_to_string(source)))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{label}: invalid: {}", e.emit_to_string(source)))?;
    Ok(())
}

#[test]
fn every_generated_kernel_validates_with_naga() {
    let kernels = generated_kernels();
    let failures: Vec<String> = kernels
        .iter()
        .filter_map(|k| validate(&k.label, &k.source).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} kernels failed naga validation:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every variant of every shader file was generated at least once.
    let labels: Vec<&String> = kernels.iter().map(|k| &k.label).collect();
    for (file, variants) in [
        ("matmul", &["matmul vec4", "matmul scalar"][..]),
        (
            "reduce",
            &[
                "thread",
                "group",
                "reduce_max thread",
                "reduce_max group",
                "reduce_min thread",
                "reduce_min group",
                "reduce_prod thread",
                "reduce_l2 group",
                "argmax",
                "argmin argmax",
                "cumsum",
                "top_k rank",
                "top_k values",
            ][..],
        ),
        (
            "indexing",
            &[
                "gather_elements",
                "scatter_elements none",
                "scatter_elements mul",
                "scatter_nd add",
                "scatter_nd max",
                "scatter_nd min",
                "gather_nd",
                "tile",
                "trilu",
                "range",
                "shape",
                "constant_of_shape",
            ][..],
        ),
        (
            "convert",
            &[
                "equal",
                "less",
                "greater",
                "less_or_equal",
                "greater_or_equal",
                "not",
                "and",
                "or",
                "xor",
                "cast",
                "one_hot",
                "dropout_train",
            ][..],
        ),
        (
            "loss",
            &[
                "softmax_cross_entropy elements",
                "softmax_cross_entropy mean",
                "nll_loss elements",
                "mse_loss none",
                "bce_with_logits",
            ][..],
        ),
        (
            "movement",
            &["transpose", "gather", "pad", "depth_to_space"][..],
        ),
        (
            "conv",
            &[
                "conv2d",
                "conv_transpose2d",
                "max_pool2d",
                "avg_pool2d",
                "resize",
            ][..],
        ),
        (
            "norm",
            &[
                "softmax",
                "layer_norm",
                "rms_norm",
                "instance_norm",
                "group_norm",
                "batch_norm",
            ][..],
        ),
        (
            "attention",
            &["attention weights", "attention output", "attention_probs"][..],
        ),
        ("einsum", &["einsum"][..]),
        (
            "recurrent",
            &[
                "recurrent init",
                "lstm step",
                "gru gates",
                "gru step",
                "recurrent y",
                "recurrent y_h",
            ][..],
        ),
        (
            "elementwise",
            &["relu", "where", "fused", "add i32", "where u32"][..],
        ),
        (
            "16-bit paths",
            &[
                "Mixed Packed",
                "Mixed Native",
                "F16 Native",
                "stats",
                "concat pack",
            ][..],
        ),
    ] {
        for v in variants {
            assert!(
                labels.iter().any(|l| l.contains(v)),
                "{file}.wgsl variant '{v}' was never generated"
            );
        }
    }
    println!("{} distinct kernels validated", kernels.len());
}
