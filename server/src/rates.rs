//! Calibrated device rates kept across processes, so a run that partitions stages weighs
//! compute, memory traffic, pass overhead and transfers as measured on its adapter
//! without measuring every time. The file is `SLUICE_CACHE_DIR/rates.json` (default
//! `$XDG_CACHE_HOME/sluice` or `~/.cache/sluice`), keyed by adapter, backend and driver;
//! an unreadable file is measured again and rewritten.

use anyhow::{Context, Result};
use sluice_engine::gpu::GpuContext;
use sluice_engine::plan::cost::Rates;
use std::collections::BTreeMap;
use std::path::PathBuf;

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

fn read_all() -> BTreeMap<String, Rates> {
    cache_dir()
        .and_then(|d| std::fs::read(d.join("rates.json")).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn write_all(all: &BTreeMap<String, Rates>) -> Result<()> {
    let dir = cache_dir().context("no cache folder (set SLUICE_CACHE_DIR)")?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!("rates.json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(all)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("rates.json"))
        .with_context(|| format!("cannot replace {}", dir.join("rates.json").display()))
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
