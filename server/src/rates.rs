//! Calibrated device rates kept across processes, so a run that partitions stages weighs
//! compute, memory traffic, pass overhead and transfers as measured on its adapter
//! without measuring every time. The file is `SLUICE_CACHE_DIR/rates.json` (default
//! `$XDG_CACHE_HOME/sluice` or `~/.cache/sluice`), keyed by adapter, backend and driver.
//! It is read as a regular file of at most [`MAX_RATES_BYTES`]; a file that cannot be
//! read or parsed, or an entry whose rates are not plausible measurements (not finite,
//! not positive, past any device), is reported with the file and the problem, then
//! ignored: its adapter is measured again and the file rewritten.

use anyhow::{Context, Result};
use sluice_engine::gpu::GpuContext;
use sluice_engine::plan::cost::Rates;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The largest rates file read: a few hundred bytes per adapter.
pub const MAX_RATES_BYTES: u64 = 1 << 20;

/// The fastest rate a kept calibration may claim, per second (an exa-op, past any device).
const MAX_RATE: f64 = 1e18;

/// Where calibrations and tunings are kept, if anywhere: `SLUICE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("SLUICE_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("sluice"));
    }
    var("HOME").map(|h| PathBuf::from(h).join(".cache").join("sluice"))
}

fn key(ctx: &GpuContext) -> String {
    ctx.adapter.cache_key()
}

fn rates_file() -> Option<PathBuf> {
    cache_dir().map(|d| d.join("rates.json"))
}

/// Why a kept calibration cannot be used, if it cannot: every rate finite, positive and
/// at most [`MAX_RATE`], the pass overhead finite and between 0 and 1 second.
pub fn implausible(r: &Rates) -> Option<String> {
    for (name, v) in [
        ("flops_per_s", r.flops_per_s),
        ("bytes_per_s", r.bytes_per_s),
        ("transfer_bytes_per_s", r.transfer_bytes_per_s),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= MAX_RATE) {
            return Some(format!("{name} is {v:e}, not a rate in (0, {MAX_RATE:e}]"));
        }
    }
    let o = r.pass_overhead_s;
    if !(o.is_finite() && (0.0..=1.0).contains(&o)) {
        return Some(format!("pass_overhead_s is {o:e}, not in [0, 1] seconds"));
    }
    None
}

/// The calibrations in `path` (none when it does not exist); an entry that is not a
/// plausible calibration is reported and left out.
fn read_file(path: &Path) -> Result<BTreeMap<String, Rates>, String> {
    let bytes = match crate::files::read_bounded(path, MAX_RATES_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let raw: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not a rates file: {e}", path.display()))?;
    let mut all = BTreeMap::new();
    for (adapter, value) in raw {
        let rates = serde_json::from_value::<Rates>(value).map_err(|e| e.to_string());
        match rates.and_then(|r| implausible(&r).map_or(Ok(r), Err)) {
            Ok(r) => {
                all.insert(adapter, r);
            }
            Err(e) => tracing::warn!(
                "{}: the kept rates of '{adapter}' are unusable ({e}); ignored, measured again when needed",
                path.display()
            ),
        }
    }
    Ok(all)
}

/// Every usable kept calibration; a file that cannot be used is reported and counts as
/// holding none.
fn read_all() -> BTreeMap<String, Rates> {
    let Some(path) = rates_file() else {
        return BTreeMap::new();
    };
    read_file(&path).unwrap_or_else(|e| {
        tracing::warn!("{e}; ignored, the rates are measured again when needed");
        BTreeMap::new()
    })
}

fn write_all(all: &BTreeMap<String, Rates>) -> Result<()> {
    let path = rates_file().context("no cache folder (set SLUICE_CACHE_DIR)")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    crate::files::write_path_durably(&path, &serde_json::to_vec_pretty(all)?)
}

/// The kept calibration of a device's adapter, or a fresh one (kept for next time);
/// `recalibrate` measures again whatever is kept.
pub fn rates_for(ctx: &GpuContext, recalibrate: bool) -> Result<Rates> {
    let k = key(ctx);
    let mut all = read_all();
    if !recalibrate {
        if let Some(r) = all.get(&k) {
            return Ok(*r);
        }
    }
    let rates = pollster::block_on(sluice_engine::gpu::probe::calibrate(ctx, recalibrate))?;
    all.insert(k, rates);
    if let Err(e) = write_all(&all) {
        tracing::warn!(
            "the calibration of {} was not kept: {e:#}",
            ctx.adapter.name
        );
    }
    Ok(rates)
}

/// The kept calibration of an adapter by its description, without measuring.
pub fn kept(ctx: &GpuContext) -> Option<Rates> {
    read_all().get(&key(ctx)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implausible_or_unreadable_calibrations_are_named_and_left_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rates.json");
        assert!(read_file(&path).expect("missing is empty").is_empty());
        let good = r#"{"flops_per_s": 1e10, "bytes_per_s": 1e10, "transfer_bytes_per_s": 2e9, "pass_overhead_s": 0.0}"#;
        let bad = r#"{"flops_per_s": -1e308, "bytes_per_s": 0, "transfer_bytes_per_s": 1e308, "pass_overhead_s": 1e308}"#;
        std::fs::write(
            &path,
            format!(r#"{{"good": {good}, "bad": {bad}, "odd": 3}}"#),
        )
        .expect("write");
        let all = read_file(&path).expect("readable");
        assert_eq!(all.keys().collect::<Vec<_>>(), ["good"]);
        assert!(implausible(&Rates::ASSUMED).is_none());
        std::fs::write(&path, "{ not json").expect("write");
        let e = read_file(&path).expect_err("not JSON");
        assert!(e.contains("rates.json is not a rates file"), "{e}");
        std::fs::write(&path, vec![b' '; (MAX_RATES_BYTES + 1) as usize]).expect("write");
        let e = read_file(&path).expect_err("too large");
        assert!(e.contains("over the limit"), "{e}");
    }
}
