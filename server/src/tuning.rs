//! The autotuner's records kept across processes: the matmul variant measured fastest for
//! each adapter, driver and problem class, so a class is measured once per machine. The
//! file is `SLUICE_AUTOTUNE_CACHE`, else `autotune.json` in the cache folder
//! ([`crate::rates::cache_dir`]), read as a regular file of at most [`MAX_TUNING_BYTES`].
//! A file that cannot be read is reported, set aside as `autotune.json.corrupt` (never
//! deleted; what is not a regular file is left where it is and never written over) and
//! tuning starts afresh.

use sluice_engine::gpu::autotune::{TuneCache, TuningStore, CACHE_FORMAT};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The tuning file the environment names, if any.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_AUTOTUNE_CACHE").filter(|p| !p.is_empty()) {
        return Some(p.into());
    }
    Some(crate::rates::cache_dir()?.join("autotune.json"))
}

/// The largest tuning file read: a record is a few hundred bytes per adapter and class.
pub const MAX_TUNING_BYTES: u64 = 16 << 20;

/// Reads a tuning file (a regular file of at most [`MAX_TUNING_BYTES`]); a missing file
/// holds nothing.
pub fn read(path: &Path) -> Result<TuneCache, String> {
    let text = match crate::files::read_text_bounded(path, MAX_TUNING_BYTES) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TuneCache::default()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let cache: TuneCache = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a tuning file: {e}", path.display()))?;
    if cache.format != CACHE_FORMAT {
        return Err(format!(
            "{} has format '{}', expected '{CACHE_FORMAT}'",
            path.display(),
            cache.format
        ));
    }
    Ok(cache)
}

/// The records in a JSON file.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    /// A store in `path`.
    pub fn new(path: PathBuf) -> FileStore {
        FileStore { path }
    }

    fn write(&self, cache: &TuneCache) -> anyhow::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(cache)?;
        crate::files::write_path_durably(&self.path, text.as_bytes())
    }
}

impl TuningStore for FileStore {
    fn load(&self) -> TuneCache {
        match read(&self.path) {
            Ok(c) => c,
            Err(e) => {
                let regular = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_file());
                if !regular {
                    tracing::warn!("autotune: {e}; left it alone and tuning afresh");
                    return TuneCache::default();
                }
                let aside = self.path.with_extension("json.corrupt");
                tracing::warn!(
                    "autotune: {e}; kept it as {} and tuning afresh",
                    aside.display()
                );
                if let Err(e) = std::fs::rename(&self.path, &aside) {
                    tracing::warn!("autotune: cannot move it aside: {e}");
                }
                TuneCache::default()
            }
        }
    }

    /// Merges with what is in the file now (other processes tune too), then replaces it
    /// through a temporary file, so a reader never sees half a file.
    fn save(&self, cache: &TuneCache) {
        let mut merged = read(&self.path).unwrap_or_default();
        merged.format = CACHE_FORMAT.into();
        for (adapter, records) in &cache.adapters {
            merged
                .adapters
                .entry(adapter.clone())
                .or_default()
                .extend(records.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if let Err(e) = self.write(&merged) {
            tracing::warn!("autotune: cannot save {}: {e:#}", self.path.display());
        }
    }
}

/// Gives the process's autotuner the tuning file (before any device opens).
pub fn install() {
    if let Some(path) = default_path() {
        sluice_engine::gpu::autotune::install_store(Arc::new(FileStore::new(path)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::gpu::autotune::{Trial, TuneRecord};

    fn record(chosen: &str) -> TuneRecord {
        TuneRecord {
            chosen: chosen.into(),
            measured_on: [128, 128, 128],
            tried: vec![Trial {
                variant: chosen.into(),
                ms: 1.5,
            }],
            skipped: Vec::new(),
        }
    }

    fn cache(adapter: &str, class: &str, chosen: &str) -> TuneCache {
        let mut c = TuneCache {
            format: CACHE_FORMAT.into(),
            ..TuneCache::default()
        };
        c.adapters
            .entry(adapter.into())
            .or_default()
            .insert(class.into(), record(chosen));
        c
    }

    #[test]
    fn saves_merge_with_what_other_processes_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sub").join("autotune.json");
        let first = FileStore::new(path.clone());
        assert_eq!(first.load(), TuneCache::default(), "no file: nothing kept");
        first.save(&cache("gpu A", "m128 n128 k128", "blocked 4x1 8x8"));
        FileStore::new(path.clone()).save(&cache("gpu B", "m256 n256 k256", "tiled 64x64"));
        let both = read(&path).expect("readable");
        assert_eq!(both.format, CACHE_FORMAT);
        assert_eq!(
            both.adapters["gpu A"]["m128 n128 k128"].chosen,
            "blocked 4x1 8x8"
        );
        assert_eq!(
            both.adapters["gpu B"]["m256 n256 k256"].chosen,
            "tiled 64x64"
        );
        let names: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["autotune.json"], "no temporary file left behind");
    }

    #[test]
    fn a_damaged_file_is_set_aside_not_lost() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("autotune.json");
        for damaged in ["{ not json", r#"{"format": "other@9", "adapters": {}}"#] {
            std::fs::write(&path, damaged).expect("write");
            assert_eq!(FileStore::new(path.clone()).load(), TuneCache::default());
            let aside = path.with_extension("json.corrupt");
            assert_eq!(std::fs::read_to_string(&aside).expect("kept"), damaged);
            assert!(!path.exists());
            std::fs::remove_file(aside).expect("remove");
        }
    }
}
