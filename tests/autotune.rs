//! The matmul autotuner: every variant it may choose gives the CPU reference's answer
//! (odd sizes, batches, bias and fused epilogues, the 16-bit storages), and a tuned
//! compile measures each class once per adapter, keeps the record in its store, reads it
//! back, and runs what it chose correctly. (The file store: `server/src/tuning.rs`.)

use serde_json::{json, Value};
use sluice_engine::exec::dataset::random_inputs;
use sluice_engine::gpu::autotune::{
    decision_count, decisions_since, Autotuner, TuneCache, TuningStore, CACHE_FORMAT,
};
use sluice_engine::gpu::tuning::MatmulVariant;
use sluice_engine::gpu::variant_timing;
use sluice_engine::gpu::GpuExecutable;
use sluice_engine::plan::{Plan, PlanOptions, Precision};
use sluice_engine::{Graph, Tensor};
use sluice_tests::kernels::OPTIONS as KERNEL_OPTIONS;
use sluice_tests::{compare, f32_in, gpu, graph, random_weights, run_cpu, single_op};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Runs `graph` on the test GPU with matmul kernels chosen by `tuner`.
fn run_with(
    tuner: Arc<Autotuner>,
    graph: &Graph,
    options: PlanOptions,
    weights: &sluice_engine::weights::Weights,
    inputs: &HashMap<String, Tensor>,
) -> Vec<(String, Tensor)> {
    let ctx = gpu().clone().with_autotuner(tuner);
    pollster::block_on(async {
        let plan = Plan::with_options(graph, options).unwrap_or_else(|e| panic!("plan: {e}"));
        let mut exe = GpuExecutable::compile(&ctx, plan, weights, 1)
            .await
            .unwrap_or_else(|e| panic!("compile: {e}"));
        exe.run_once(inputs)
            .await
            .unwrap_or_else(|e| panic!("run: {e}"))
    })
}

/// A matmul of `a` and `b`, and a linear with bias into a fused relu.
fn cases() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (a, b) in [
        (vec![37, 20], vec![20, 12]),
        (vec![64, 64], vec![64, 64]),
        (vec![130, 36], vec![36, 68]),
        (vec![3, 33, 16], vec![3, 16, 20]),
        (vec![2, 70, 8], vec![8, 132]),
    ] {
        out.push((
            format!("matmul {a:?}·{b:?}"),
            single_op("matmul", json!({}), &[f32_in("a", &a), f32_in("b", &b)], 1),
        ));
    }
    out.push((
        "linear [67, 24] → 44, bias, relu".into(),
        json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [67, 24] } },
            "nodes": [
                { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 44 } },
                { "id": "act", "op": "relu", "inputs": ["fc"] }
            ],
            "outputs": ["act"]
        }),
    ));
    out
}

/// f32 fused and unfused, and mixed precision with packed storage.
const OPTIONS: &[PlanOptions] = KERNEL_OPTIONS.split_at(3).0;

#[test]
fn every_matmul_variant_matches_the_cpu_reference() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for (i, (label, doc)) in cases().iter().enumerate() {
        let g = graph(doc);
        let weights = random_weights(&g, 30 + i as u64);
        let inputs = random_inputs(&g, 60 + i as u64).expect("bound graph");
        let want = run_cpu(&g, &weights, &inputs);
        for &options in OPTIONS {
            let (rtol, atol) = if options.precision == Precision::Mixed {
                (2e-2, 2e-2)
            } else {
                (1e-4, 1e-4)
            };
            let mut first: Option<Vec<(String, Tensor)>> = None;
            for variant in MatmulVariant::ALL {
                let tuner = Arc::new(Autotuner::forcing(variant));
                let got = run_with(tuner, &g, options, &weights, &inputs);
                runs += 1;
                let what = format!("{label}, {:?}, {}", options.precision, variant.name());
                for ((name, a), (_, b)) in got.iter().zip(&want) {
                    if let Err(e) = compare(&format!("{what}: {name}"), a, b, rtol, atol) {
                        failures.push(e);
                    }
                }
                // Every variant adds the products in the same order: the same bits.
                match &first {
                    None => first = Some(got),
                    Some(f) => {
                        for ((name, a), (_, b)) in got.iter().zip(f) {
                            if a != b {
                                failures.push(format!(
                                    "{what}: {name} differs from {}'s bits",
                                    MatmulVariant::ALL[0].name()
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A variant the adapter cannot run gives way to the default; on lavapipe (8-lane
    // subgroups) every one runs, so none was checked by proxy.
    let given_way: Vec<String> = MatmulVariant::ALL
        .iter()
        .filter(|&&v| !variant_timing::fits(gpu(), v))
        .map(|v| v.name())
        .collect();
    if gpu().adapter.subgroup_lanes == Some(8) {
        assert!(given_way.is_empty(), "not run here: {given_way:?}");
    }
    println!(
        "{runs} runs: {} matmul variants × {} problems × {} plan options equal the CPU reference \
         (on {}; given way to the default: {given_way:?})",
        MatmulVariant::ALL.len(),
        cases().len(),
        OPTIONS.len(),
        gpu().describe()
    );
}

/// Records kept in memory, as a front's file would keep them.
#[derive(Debug, Default)]
struct MemoryStore {
    kept: Mutex<TuneCache>,
    saves: Mutex<usize>,
}

impl TuningStore for MemoryStore {
    fn load(&self) -> TuneCache {
        self.kept.lock().expect("store").clone()
    }

    fn save(&self, cache: &TuneCache) {
        *self.kept.lock().expect("store") = cache.clone();
        *self.saves.lock().expect("store") += 1;
    }
}

#[test]
fn the_tuner_measures_a_class_once_keeps_it_in_its_store_and_runs_its_choice_correctly() {
    let store = Arc::new(MemoryStore::default());
    // 128³ multiply-adds: large enough to tune.
    let doc = single_op(
        "matmul",
        json!({}),
        &[f32_in("a", &[128, 128]), f32_in("b", &[128, 128])],
        1,
    );
    let g = graph(&doc);
    let weights = random_weights(&g, 5);
    let inputs = random_inputs(&g, 6).expect("bound graph");
    let want = run_cpu(&g, &weights, &inputs);
    let before = decision_count();
    let tuner = Arc::new(Autotuner::new(true, Some(store.clone())));
    let got = run_with(tuner, &g, OPTIONS[0], &weights, &inputs);
    compare("tuned matmul", &got[0].1, &want[0].1, 1e-4, 1e-4).unwrap_or_else(|e| panic!("{e}"));

    let kept = store.load();
    let adapter = gpu().adapter.cache_key();
    let records = kept
        .adapters
        .get(&adapter)
        .unwrap_or_else(|| panic!("no records for {adapter} in {kept:?}"));
    let class = "m128 n128 k128 f32·f32→f32 f32";
    let record = records
        .get(class)
        .unwrap_or_else(|| panic!("no record for {class} in {records:?}"));
    assert_eq!(kept.format, CACHE_FORMAT);
    assert_eq!(record.measured_on, [128, 128, 128]);
    assert!(record.tried.len() >= 2, "tried {:?}", record.tried);
    assert!(record.tried.iter().all(|t| t.ms > 0.0 && t.ms.is_finite()));
    assert!(record.tried.iter().any(|t| t.variant == record.chosen));
    assert!(MatmulVariant::parse(&record.chosen).is_some());
    println!("{adapter}: {class}: chose {}", record.chosen);
    for t in &record.tried {
        println!("    {:<18} {:.3} ms", t.variant, t.ms);
    }

    // A fresh tuner on the same store reads the choice back instead of measuring.
    let again = Arc::new(Autotuner::new(true, Some(store.clone())));
    let got = run_with(again, &g, OPTIONS[0], &weights, &inputs);
    compare("cached matmul", &got[0].1, &want[0].1, 1e-4, 1e-4).unwrap_or_else(|e| panic!("{e}"));
    let mine: Vec<_> = decisions_since(before)
        .into_iter()
        .filter(|d| d.class == class && d.adapter == adapter)
        .collect();
    assert_eq!(
        mine.iter().map(|d| d.measured).collect::<Vec<_>>(),
        [true, false],
        "measured once, then read back"
    );
    assert_eq!(*store.saves.lock().expect("store"), 1, "saved once");

    // Turned off, nothing is measured or kept, and the default kernel runs.
    let off = Arc::new(Autotuner::new(false, None));
    let got = run_with(off, &g, OPTIONS[0], &weights, &inputs);
    compare("untuned matmul", &got[0].1, &want[0].1, 1e-4, 1e-4).unwrap_or_else(|e| panic!("{e}"));
    let after_off = decisions_since(before)
        .into_iter()
        .filter(|d| d.class == class && d.adapter == adapter)
        .count();
    assert_eq!(after_off, 2, "an autotuner turned off decides nothing");
}

/// A textured product of two kept inputs stages each into its texture once and reuses it
/// while the input is unchanged; keeping a new value, or giving a kept input again, stages
/// it anew (a stale texture would give the old product).
#[test]
fn kept_inputs_staged_in_textures_are_staged_again_when_replaced() {
    use sluice_engine::exec::device::Executable;
    let g = graph(&json!({
        "format": "sluice/graph@1",
        "inputs": { "a": { "shape": [64, 32] }, "b": { "shape": [32, 48] } },
        "nodes": [{ "id": "c", "op": "matmul", "inputs": ["a", "b"] }],
        "outputs": ["c"]
    }));
    let weights = random_weights(&g, 1);
    let first = random_inputs(&g, 2).expect("bound graph");
    let second = random_inputs(&g, 3).expect("bound graph");
    let pick = |from: &HashMap<String, Tensor>, name: &str| -> HashMap<String, Tensor> {
        HashMap::from([(name.to_string(), from[name].clone())])
    };
    let textured = MatmulVariant::ALL
        .into_iter()
        .find(|v| matches!(v, MatmulVariant::Textured { .. }))
        .expect("a textured variant");
    let ctx = gpu()
        .clone()
        .with_autotuner(Arc::new(Autotuner::forcing(textured)));
    let want = |a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>| {
        let mut inputs = pick(a, "a");
        inputs.extend(pick(b, "b"));
        run_cpu(&g, &weights, &inputs)
    };
    let check = |what: &str, got: Vec<(String, Tensor)>, want: Vec<(String, Tensor)>| {
        for ((name, a), (_, b)) in got.iter().zip(&want) {
            if let Err(e) = compare(&format!("{what}: {name}"), a, b, 1e-4, 1e-4) {
                panic!("{e}");
            }
        }
    };
    pollster::block_on(async {
        let plan = Plan::with_options(&g, PlanOptions::default()).expect("plan");
        let mut exe = GpuExecutable::compile(&ctx, plan, &weights, 2)
            .await
            .expect("compile");
        let none = HashMap::new();
        let mut both = pick(&first, "a");
        both.extend(pick(&first, "b"));
        exe.keep_inputs(&both).expect("keep a and b");
        for run in ["first run", "second run", "third run"] {
            let got = exe.run_once(&none).await.expect("run");
            check(run, got, want(&first, &first));
        }
        exe.keep_inputs(&pick(&second, "b")).expect("keep a new b");
        let got = exe.run_once(&none).await.expect("run");
        check("b kept anew", got, want(&first, &second));
        let got = exe.run_once(&pick(&second, "a")).await.expect("run");
        check("a given again", got, want(&second, &second));
        let got = exe.run_once(&none).await.expect("run");
        check("a kept since given", got, want(&second, &second));
    });
}
