//! Random graph documents for property tests: every operator of the schema list (and an
//! unknown one), attributes of every kind with ordinary and extreme values (0, ±1,
//! i64::MIN/MAX, 2^33, long lists, huge floats, wrong types), shapes with symbols, zeros
//! and huge dimensions, dangling references and ports. Built from a seed with the
//! engine's own generator, so a failing case is reproduced from the seed it reports.

use crate::ops::attrs::AttrKind;
use crate::ops::schemas;
use crate::rng::Rng;
use serde_json::{json, Map, Value};

/// How wild a document may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Any value anywhere: the document is meant to be refused in many ways.
    Hostile,
    /// Small sizes and sensible attributes: many documents are accepted and can run.
    Tame,
}

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

fn int(rng: &mut Rng, mode: Mode) -> i64 {
    match mode {
        Mode::Tame => rng.below(7) as i64 - 3,
        Mode::Hostile => *pick(
            rng,
            &[
                0,
                1,
                -1,
                2,
                3,
                -2,
                4,
                i64::MIN,
                i64::MAX,
                i64::MIN + 1,
                i64::MAX - 1,
                1 << 33,
                -(1 << 33),
                1 << 62,
                i64::from(i32::MAX),
                i64::from(u32::MAX),
            ],
        ),
    }
}

fn ints(rng: &mut Rng, mode: Mode) -> Value {
    let len = match (mode, rng.below(12)) {
        (Mode::Hostile, 0) => 2000,
        (_, l) => (l % 5) as usize,
    };
    Value::Array((0..len).map(|_| json!(int(rng, mode))).collect())
}

fn float(rng: &mut Rng, mode: Mode) -> Value {
    let v = match mode {
        Mode::Tame => f64::from(rng.below(5) as u32) - 2.0,
        Mode::Hostile => *pick(rng, &[0.0, 1.0, -1.0, 0.5, 1e30, -1e30, 1e-30, f64::MAX]),
    };
    json!(v)
}

fn attr(rng: &mut Rng, mode: Mode, kind: AttrKind, name: &str) -> Value {
    if mode == Mode::Tame {
        // Lists that must agree in length (slices) have one entry; dropout needs a ratio.
        match name {
            "starts" | "ends" | "steps" => return json!([int(rng, mode).max(1)]),
            "axes" if rng.below(2) == 0 => return json!([rng.below(2)]),
            "ratio" => return json!(0.5),
            _ => {}
        }
    }
    if mode == Mode::Hostile && rng.below(12) == 0 {
        return pick(
            rng,
            &[
                json!("x"),
                json!(null),
                json!([[1]]),
                json!({}),
                json!(true),
            ],
        )
        .clone();
    }
    match kind {
        AttrKind::Int if mode == Mode::Tame && name.contains("out") => json!(1 + rng.below(4)),
        AttrKind::Int if mode == Mode::Tame && name == "groups" => json!(1),
        AttrKind::Int => json!(int(rng, mode)),
        AttrKind::Float => float(rng, mode),
        AttrKind::Bool => json!(rng.below(2) == 1),
        AttrKind::Ints | AttrKind::PerAxis(_) if mode == Mode::Tame && name == "kernel_size" => {
            json!([1 + rng.below(2), 1 + rng.below(2)])
        }
        AttrKind::Ints | AttrKind::PerAxis(_)
            if mode == Mode::Tame && matches!(name, "strides" | "dilations") =>
        {
            json!([1, 1 + rng.below(2)])
        }
        AttrKind::Ints | AttrKind::PerAxis(_) if mode == Mode::Tame && name == "pads" => {
            json!([rng.below(2), 0])
        }
        AttrKind::Ints | AttrKind::PerAxis(_) => ints(rng, mode),
        AttrKind::Floats => {
            let len = match (mode, rng.below(10)) {
                (Mode::Hostile, 0) => 3000,
                (_, l) => (l % 5) as usize,
            };
            Value::Array((0..len).map(|_| float(rng, mode)).collect())
        }
        AttrKind::Text => json!(format!("n{}.weight", rng.below(3))),
        AttrKind::Choice(choices) => match (mode, rng.below(5)) {
            (Mode::Hostile, 0) => json!("nonsense"),
            _ => json!(pick(rng, choices)),
        },
    }
}

fn dim(rng: &mut Rng, mode: Mode) -> Value {
    match (mode, rng.below(14)) {
        (_, 0) => json!("N"),
        (Mode::Tame, _) => json!(1 + rng.below(3)),
        (Mode::Hostile, 1) => json!(0),
        (Mode::Hostile, 2) => json!(u64::MAX),
        (Mode::Hostile, 3) => json!(1u64 << 40),
        (Mode::Hostile, 4) => json!(-3),
        (Mode::Hostile, 5) => json!("M"),
        (Mode::Hostile, 6) => json!("N*N"),
        (Mode::Hostile, _) => json!(1 + rng.below(5)),
    }
}

/// A random document, reproducible from `seed`.
pub fn random_document(seed: u64, mode: Mode) -> Value {
    let mut rng = Rng::new(seed);
    let mut names: Vec<String> = Vec::new();
    let mut inputs = Map::new();
    for i in 0..1 + rng.below(3) {
        let rank = match (mode, rng.below(10)) {
            (Mode::Hostile, 0) => 12,
            (Mode::Hostile, r) => (r % 4) as usize,
            (Mode::Tame, r) => 1 + (r % 4) as usize,
        };
        let shape: Vec<Value> = (0..rank).map(|_| dim(&mut rng, mode)).collect();
        let dtype = match rng.below(8) {
            0 => "i32",
            1 => "bool",
            _ => "f32",
        };
        let name = format!("x{i}");
        inputs.insert(name.clone(), json!({ "shape": shape, "dtype": dtype }));
        names.push(name);
    }
    let all = schemas();
    let mut nodes = Vec::new();
    for i in 0..1 + rng.below(6) {
        let (op, attrs_of) = match (mode, rng.below(40)) {
            (Mode::Hostile, 0) => ("warp_drive", None),
            _ => {
                let s = *pick(&mut rng, &all);
                (s.name, Some(s.attrs))
            }
        };
        let mut attrs = Map::new();
        for spec in attrs_of.unwrap_or_default() {
            // A tame split gives a number of parts, never sizes as well.
            let split_sizes = op == "split" && spec.name == "sizes";
            let split_parts = op == "split" && spec.name == "num_outputs";
            let skip = match mode {
                Mode::Tame if split_sizes => true,
                Mode::Tame if split_parts => false,
                _ => rng.below(4) == 0 && spec.default.is_some(),
            };
            if !skip {
                attrs.insert(spec.name.into(), attr(&mut rng, mode, spec.kind, spec.name));
            }
        }
        let arity = match crate::ops::schema(op).map(|s| s.inputs) {
            Some(crate::ops::Arity::Fixed(n)) if rng.below(10) > 0 || mode == Mode::Tame => n.len(),
            Some(crate::ops::Arity::Variadic(min)) if mode == Mode::Tame => {
                min + rng.below(3) as usize
            }
            _ => rng.below(4) as usize,
        };
        let refs: Vec<Value> = (0..arity)
            .map(|_| {
                let name = pick(&mut rng, &names).clone();
                match (mode, rng.below(16)) {
                    (Mode::Hostile, 0) => json!("nowhere"),
                    (Mode::Hostile, 1) => json!(format!("{name}:7")),
                    (Mode::Hostile, 2) => json!(format!("{name}:{}", u64::MAX)),
                    _ => json!(name),
                }
            })
            .collect();
        let id = format!("n{i}");
        nodes.push(json!({ "id": id, "op": op, "inputs": refs, "attrs": attrs }));
        names.push(id);
    }
    let last = names.last().cloned().unwrap_or_default();
    let mut outputs = vec![json!(last)];
    if mode == Mode::Hostile && rng.below(4) == 0 {
        outputs.push(json!(format!("{last}:1")));
    }
    json!({
        "format": "sluice/graph@1",
        "inputs": inputs,
        "nodes": nodes,
        "outputs": outputs,
        "params": { "seed": rng.below(100) }
    })
}
