//! The codemap's rules, checked on the source: no import circles between files in any
//! crate, and in the engine nothing low imports something above it (the layers
//! ARCHITECTURE.md lists: the execution core knows no backend, the backends know the
//! seam, planning knows no device).

use sluice_tests::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file of a crate's `src`, by module path (`exec::driver`; the root is "").
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                let mut next = prefix.to_vec();
                next.push(name);
                walk(&p, &next, out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let mut path = prefix.to_vec();
                if !matches!(stem, "mod" | "lib" | "main") {
                    path.push(stem.to_string());
                }
                out.insert(path.join("::"), p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out);
    out
}

/// The code of a file without comments, string contents and its test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a file refers to with `crate::...` or `super::...` paths (including the
/// items of `use` groups), resolved to the longest module that exists.
fn references(module: &str, code: &str, known: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = code.chars().collect();
    let text: String = chars.iter().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let (base, skip) = if rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if rest.starts_with("super::") {
            let mut parts: Vec<String> = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            // A file's `super` is its parent module (mod.rs files are their own module).
            parts.pop();
            (parts, "super::".len())
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        if i > 0 && text[..i].chars().last().is_some_and(is_ident) {
            i += skip;
            continue;
        }
        let tail = &rest[skip..];
        let mut segments = base.clone();
        let mut j = 0;
        let bytes: Vec<char> = tail.chars().collect();
        let group = |segments: &[String], j: usize, out: &mut BTreeSet<String>| {
            // A use group: each item may name a submodule.
            let end = bytes[j..]
                .iter()
                .position(|&c| c == '}')
                .map_or(bytes.len(), |e| j + e);
            let items: String = bytes[j + 1..end].iter().collect();
            for item in items.split(',') {
                let first = item.trim().split("::").next().unwrap_or("").trim();
                let mut s = segments.to_vec();
                s.push(first.to_string());
                if let Some(m) = longest(&s, known) {
                    out.insert(m);
                }
            }
        };
        if bytes.first() == Some(&'{') {
            group(&segments, 0, &mut out);
        }
        loop {
            let start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            if j == start {
                break;
            }
            segments.push(bytes[start..j].iter().collect());
            if bytes.get(j) == Some(&':') && bytes.get(j + 1) == Some(&':') {
                j += 2;
                if bytes.get(j) == Some(&'{') {
                    group(&segments, j, &mut out);
                    break;
                }
            } else {
                break;
            }
        }
        if let Some(m) = longest(&segments, known) {
            out.insert(m);
        }
        i += skip + j.max(1);
    }
    out.remove(module);
    out
}

fn longest(segments: &[String], known: &BTreeMap<String, PathBuf>) -> Option<String> {
    (0..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|p| known.contains_key(p) && !p.is_empty())
}

/// The import graph of a crate: module → modules it refers to.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let known = modules(src);
    known
        .iter()
        .map(|(m, p)| (m.clone(), references(m, &code(p), &known)))
        .collect()
}

/// Every cycle's members (strongly connected components of more than one module).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm.
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_crate_has_an_import_circle_between_files() {
    let mut found = Vec::new();
    for krate in ["engine", "server", "server/api", "editor", "xtask"] {
        let g = graph(&root().join(krate).join("src"));
        assert!(
            g.len() > 1 || krate == "server/api",
            "{krate}: no modules found"
        );
        for c in circles(&g) {
            found.push(format!("{krate}: {}", c.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The engine's layers, lowest first: a module may refer only to its own top module and
/// to lower layers.
const LAYERS: &[&[&str]] = &[
    &["dtype", "shape", "rng", "error", "telemetry"],
    &["storage"],
    &["tensor"],
    &["npy", "ops"],
    &["graph"],
    &["weights", "limits"],
    &["autodiff"],
    &["plan"],
    &["exec"],
    &["cpu", "gpu"],
    &["precision"],
    &["train"],
    &["onnx"],
];

fn layer(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or("");
    LAYERS.iter().position(|l| l.contains(&top))
}

#[test]
fn nothing_low_in_the_engine_imports_something_above_it() {
    let g = graph(&root().join("engine/src"));
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (m, refs) in &g {
        if m.is_empty() {
            continue;
        }
        let Some(lm) = layer(m) else {
            wrong.push(format!("module '{m}' is in no layer of the codemap"));
            continue;
        };
        let top = m.split("::").next().unwrap_or("");
        for r in refs {
            let rtop = r.split("::").next().unwrap_or("");
            if rtop == top {
                continue;
            }
            checked += 1;
            match layer(r) {
                Some(lr) if lr < lm => {}
                _ => wrong.push(format!("{m} refers to {r}")),
            }
        }
    }
    assert!(checked > 50, "only {checked} references seen");
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}
